"""The online iterative preference loop: prompt augmentation, round sampling, labelling."""
