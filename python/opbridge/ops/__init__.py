"""Python entry points of the torch ops (``torch.ops.opbridge.*``).

Importing this package loads the torch extension and registers, per op, its fake (meta) kernel
and autograd formula. Every module in this package is one op; its public functions are
re-exported here, so adding an op means adding a module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._library import load_torch_library
from .._op_library import opbridge_library
from ._errors import translate_errors
from ._package import load_op_modules, load_package_ops
from ._torch_adapter import (
    no_grad_fast_path, register_autograd, register_fake, register_gradient, register_library_ops)

load_torch_library()

__all__: list[str] = ["load_package_ops", "no_grad_fast_path", "register_autograd", "register_fake",
                      "register_gradient", "register_library_ops", "translate_errors"]
__all__ += load_op_modules(globals())

# Fake kernels (and a clear error for ops without a gradient formula) from the declarations,
# after the op modules above registered their formulas.

if TYPE_CHECKING:
    # What the loop above re-exports, spelled out for type checkers, which do not run it
    # (tests/test_typing.py checks that the two agree).
    from .group_norm import group_norm as group_norm
    from .inverse import inverse as inverse
    from .ms_deform_attn import ms_deform_attn as ms_deform_attn
    from .point_cloud import ball_query as ball_query
    from .point_cloud import furthest_point_sample as furthest_point_sample
    from .point_cloud import gather_points as gather_points
    from .point_cloud import grouping_operation as grouping_operation
    from .point_cloud import knn as knn
    from .point_cloud import three_interpolate as three_interpolate
    from .point_cloud import three_nn as three_nn

register_library_ops(opbridge_library())
