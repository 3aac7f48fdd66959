"""Build script for the compiled core; metadata lives in pyproject.toml.

``python setup.py build_ext --inplace`` (or ``pip install -e .``) cythonizes ``hpbroker/_core.pyx``
(record batches), ``hpbroker/_columnar.pyx`` (batches to columns, for the Spark data source)
and ``hpbroker/io/_writer.pyx`` (group-commit I/O off the GIL) together with
the C helpers in ``hpbroker/_csrc``.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "hpbroker._core",
        sources=["hpbroker/_core.pyx", "hpbroker/_csrc/crc32c.c"],
        include_dirs=["hpbroker/_csrc"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
    Extension(
        "hpbroker._columnar",
        sources=["hpbroker/_columnar.pyx", "hpbroker/_csrc/crc32c.c"],
        include_dirs=["hpbroker/_csrc"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
    Extension(
        "hpbroker.io._writer",
        sources=["hpbroker/io/_writer.pyx", "hpbroker/_csrc/group_commit.c"],
        include_dirs=["hpbroker/_csrc"],
        extra_compile_args=["-O2", "-pthread"],
        extra_link_args=["-pthread"],
    ),
    Extension(
        "hpbroker.client._accumulator",
        sources=["hpbroker/client/_accumulator.pyx", "hpbroker/_csrc/crc32c.c"],
        include_dirs=["hpbroker/_csrc"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "embedsignature": True},
        annotate=False,
    ),
)
