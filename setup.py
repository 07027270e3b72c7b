"""Build hook for the C frame decoder (the rest of the metadata lives in setup.cfg)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "danube_core._fastdecode",
            sources=["danube_core/_fastdecode.c"],
            extra_compile_args=["-O3"],
        )
    ]
)
