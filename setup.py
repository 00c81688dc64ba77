"""Build steps that pyproject.toml cannot express.

1. Python code for the project's own ``.proto`` files under ``protos/`` is
   generated with grpcio-tools into ``src/meshpilot/_proto`` (kept out of git).
2. The Cython hot paths under ``ext/`` are compiled into ``meshpilot._ext``,
   unless ``MESHPILOT_NO_EXTENSIONS=1`` asks for a pure-Python build. Where no C
   compiler works, the build warns and goes on without them: the pure-Python twins
   do the same work, slower. ``MESHPILOT_REQUIRE_EXTENSIONS=1`` makes that an error
   instead (the container image is built so).

The build prints which of the two modes it produced.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
PROTO_ROOT = ROOT / "protos"
GENERATED = ROOT / "src" / "meshpilot" / "_proto"
NO_EXTENSIONS = os.environ.get("MESHPILOT_NO_EXTENSIONS", "") not in ("", "0")
REQUIRE_EXTENSIONS = os.environ.get("MESHPILOT_REQUIRE_EXTENSIONS", "") not in ("", "0")


def generate_protos() -> None:
    """Run protoc (from grpcio-tools) over every file under protos/."""
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    if not sources:
        return
    include = Path(grpc_tools.__file__).parent / "_proto"
    out = ROOT / "src"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on protos/")
    # protoc writes no __init__.py; make every generated directory a package.
    for directory in [GENERATED, *(p for p in GENERATED.rglob("*") if p.is_dir())]:
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text("")
    print(f"meshpilot: generated Python code for {len(sources)} proto files", file=sys.stderr)


class GenerateProtos(Command):
    """``python setup.py gen_protos``: regenerate protobuf code in place."""

    description = "generate Python code from protos/"
    user_options: list[tuple[str, str | None, str]] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        generate_protos()


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        generate_protos()
        # Packages were discovered before the generated ones existed.
        self.packages = sorted({*(self.packages or []), *_generated_packages()})
        super().run()


def _generated_packages() -> list[str]:
    src = ROOT / "src"
    return [
        ".".join(p.parent.relative_to(src).parts)
        for p in GENERATED.rglob("__init__.py")
    ]


def extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        print("meshpilot: pure-Python build (MESHPILOT_NO_EXTENSIONS=1)", file=sys.stderr)
        return []
    from Cython.Build import cythonize

    # Each ext/NAME.pyx becomes meshpilot._ext.NAME. Shared C-level helpers are
    # inline functions in .pxd files under ext/ (no module of their own).
    modules = cythonize(
        [
            Extension(f"meshpilot._ext.{pyx.stem}", [str(pyx.relative_to(ROOT))])
            for pyx in sorted((ROOT / "ext").glob("*.pyx"))
        ],
        include_path=["ext"],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
    print(
        "meshpilot: compiled build with " + ", ".join(m.name for m in modules),
        file=sys.stderr,
    )
    return modules


class BuildExtOrTwins(build_ext):
    """A hot path that does not compile (no compiler, no Python headers) is left to its pure-Python
    twin, with a warning, so that installing never needs a compiler."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # no compiler at all (setuptools' PlatformError and kin)
            self._fall_back(err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:  # CompileError, LinkError, a compiler that cannot be run
            self._fall_back(err, ext.name)

    def _fall_back(self, err: Exception, name: str = "") -> None:
        if REQUIRE_EXTENSIONS:
            raise err
        print(
            f"meshpilot: WARNING: {name or 'the compiled hot paths'} not built ({err}); "
            "the pure-Python twin is used instead (same behaviour, slower). "
            "Install a C compiler and Python's headers for the compiled build.",
            file=sys.stderr,
        )


setup(
    ext_modules=extensions(),
    cmdclass={"build_py": BuildPyWithProtos, "build_ext": BuildExtOrTwins, "gen_protos": GenerateProtos},
)
