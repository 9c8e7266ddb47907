"""Only here to build the optional C kernel of the MCB packing (vcsched/solvers/_mcbc.c).

Everything else is declared in pyproject.toml.  If no compiler is available the
build still succeeds and vcsched falls back to its pure-Python packing, unless
the environment sets ``VCSCHED_REQUIRE_C=1`` (CI does, in .ci/run): then a
kernel that cannot be built fails the install.
"""

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRE_C = os.environ.get("VCSCHED_REQUIRE_C") == "1"


class KernelNotBuilt(RuntimeError):
    """The C kernel failed to build although VCSCHED_REQUIRE_C=1."""


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except KernelNotBuilt:
            raise
        except Exception as exc:
            self._failed(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._failed(exc, ext.name)

    @staticmethod
    def _failed(exc: Exception, name: str = "the C kernel") -> None:
        if REQUIRE_C:
            raise KernelNotBuilt(f"VCSCHED_REQUIRE_C=1 but {name} could not be built: {exc}") from exc
        print(f"warning: {name} not built ({exc}); using the pure-Python packing")


ext_modules = []
if Path("vcsched/solvers/_mcbc.c").exists():
    ext_modules.append(Extension("vcsched.solvers._mcbc", ["vcsched/solvers/_mcbc.c"], extra_compile_args=["-O3"]))
elif REQUIRE_C:
    raise KernelNotBuilt("VCSCHED_REQUIRE_C=1 but vcsched/solvers/_mcbc.c is missing")

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
