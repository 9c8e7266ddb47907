"""Only here to build the optional C kernel of the MCB packing (vcsched/_mcbc.c).

Everything else is declared in pyproject.toml.  If no compiler is available the
build still succeeds and vcsched falls back to its pure-Python packing.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(f"warning: C kernel not built ({exc}); using the pure-Python packing")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} not built ({exc}); using the pure-Python packing")


ext_modules = []
if Path("vcsched/solvers/_mcbc.c").exists():
    ext_modules.append(Extension("vcsched.solvers._mcbc", ["vcsched/solvers/_mcbc.c"], extra_compile_args=["-O3"]))

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
