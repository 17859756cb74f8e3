"""reasonrl: post-training of language models for math and code reasoning.

Importing the package asks torch for its AVX2 kernels and MKL for its AVX2 branch on x86-64,
so a run's numbers depend less on the CPU it ran on (reasonrl.manifest says how much they
did). Both are read as torch and MKL start, hence here, before any module imports torch. A
user who exports either variable keeps their own value (e.g. ATEN_CPU_CAPABILITY=avx512 for
speed). MKL promises the AVX2 branch's results across Intel CPUs with AVX2; on other vendors
it runs its automatic branch (on an AMD EPYC, the same weights as the AVX2 setting).
"""

import os as _os
import platform as _platform

__version__ = "0.1.0"

PORTABLE_FLOAT_CODE_PATH = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}

if _platform.machine() in ("x86_64", "AMD64"):
    for _name, _value in PORTABLE_FLOAT_CODE_PATH.items():
        _os.environ.setdefault(_name, _value)
