"""Build hook only: every piece of metadata lives in pyproject.toml.

The ``ibverbs`` RDMA backend's cffi module (:mod:`meshio._ibverbs_ffi`) is
compiled when libibverbs' header is installed (Debian: ``libibverbs-dev``);
without it meshio installs as pure Python and that backend is absent.  Set
``MESHIO_IBVERBS=0`` to skip the module even where the header exists.
"""

import os

from setuptools import setup

VERBS_H = "/usr/include/infiniband/verbs.h"

if os.path.exists(VERBS_H) and os.environ.get("MESHIO_IBVERBS", "1") != "0":
    setup(cffi_modules=["src/meshio/rdma/_ibverbs_build.py:ffi"])
else:
    setup()
