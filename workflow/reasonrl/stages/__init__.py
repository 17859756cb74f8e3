"""Stage functions: one module per workflow/rules/*.smk file, one function per CLI verb."""
