"""CI only: let PyPI torchvision import beside the CPU torch wheel.

torchvision 0.28.0 from PyPI (installed --no-deps next to torch 2.13.0+cpu)
fails at import with ``operator torchvision::nms does not exist`` because its
compiled ops do not load. SGLang imports ``torchvision.transforms`` at module
level. Declaring the two op schemas before torchvision's own import lets it
import; its compiled ops stay unusable (SGLang's text path never calls them).
A meta-path hook does this only when torchvision is first imported, so other
programs in the environment pay nothing.
"""

import importlib.abc
import sys


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        try:
            import torch

            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define(
                "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            )
            globals()["_keep_alive"] = lib
        except Exception:
            pass
        return None


sys.meta_path.insert(0, _DeclareTorchvisionOps())
