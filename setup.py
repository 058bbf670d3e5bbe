"""Builds the compiled modules: the block table (``policies._blocktable``) and a relayed
stream's per-chunk work (``gateway._relay``); everything else is in pyproject.toml.
``optional``: where no C compiler is at hand the install still succeeds and their
pure-Python twins serve (``policies.block_table_py``; ``gateway.request.streaming.PyEventTap``
and ``gateway.server.http.CycleBodyWriter._write``)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "policies._blocktable",
            sources=["policies/_blocktable.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "gateway._relay",
            sources=["gateway/_relay.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ]
)
