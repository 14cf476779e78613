"""The build step of `pip install .` (pyproject.toml): runs make for build/libvmmshim.so and puts
it in the package (vmmshim/lib/libvmmshim.so), with the launcher and the replay and report
scripts (vmmshim/bin/, run by the console scripts of vmmshim/_entry.py). The package's version
is include/vmmshim.h's (vmmshim.__version__ is a copy that tests/scripts/test_docs_code.py
checks). The Python sources stay where they are: the vmmshim package is scripts/python/vmmshim,
vmmshim.report is scripts/vmmshim_report."""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "include", "vmmshim.h")) as f:
        m = re.search(r'^#define VMMSHIM_VERSION "([^"]+)"', f.read(), re.M)
    if not m:
        raise SystemExit("setup.py: no VMMSHIM_VERSION in include/vmmshim.h")
    return m.group(1)


class BuildWithLibrary(build_py):
    """build_py, then make's library and the scripts into the built package."""

    def run(self):
        build_py.run(self)
        build = os.environ.get("BUILD", "build")
        subprocess.check_call(["make", "-C", ROOT, "BUILD=" + build, build + "/libvmmshim.so"])
        pkg = os.path.join(self.build_lib, "vmmshim")
        for src, dst, mode in ((os.path.join(ROOT, build, "libvmmshim.so"), "lib/libvmmshim.so", 0o755),
                               (os.path.join(ROOT, "scripts", "vmmshim"), "bin/vmmshim", 0o755),
                               (os.path.join(ROOT, "scripts", "vmmshim-report"), "bin/vmmshim-report", 0o755),
                               (os.path.join(ROOT, "scripts", "vmmshim-replay"), "bin/vmmshim-replay", 0o755)):
            out = os.path.join(pkg, dst)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            shutil.copyfile(src, out)
            os.chmod(out, mode)


class WithLibrary(Distribution):
    """The wheel holds a native library: a platform wheel, not a pure one."""

    def has_ext_modules(self):
        return True


setup(
    version=version(),
    packages=["vmmshim", "vmmshim.report"],
    package_dir={"vmmshim": "scripts/python/vmmshim", "vmmshim.report": "scripts/vmmshim_report"},
    package_data={"vmmshim": ["compat/torch_memory_saver/__init__.py"], "vmmshim.report": ["page.js"]},
    cmdclass={"build_py": BuildWithLibrary},
    distclass=WithLibrary,
    zip_safe=False,
)
