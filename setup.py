"""Builds the compiled block table (``policies._blocktable``); everything else is in
pyproject.toml. ``optional``: where no C compiler is at hand the install still
succeeds and the pure-Python table (``policies.block_table_py``) serves."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "policies._blocktable",
            sources=["policies/_blocktable.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
