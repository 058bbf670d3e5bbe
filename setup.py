"""Builds the compiled modules: the block table (``policies._blocktable``) and a relayed
stream's per-chunk work (``gateway._relay``); everything else is in pyproject.toml.
``optional``: where no C compiler is at hand the install still succeeds and their
pure-Python twins serve (``policies.block_table_py``; ``gateway.request.streaming.PyEventTap``
and ``gateway.server.http.CycleBodyWriter._write``)."""

from setuptools import Extension, setup

C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension(name, sources=[source], extra_compile_args=C_FLAGS, optional=True)
        for name, source in (("policies._blocktable", "policies/_blocktable.c"),
                             ("gateway._relay", "gateway/_relay.c"))
    ]
)
