"""Camera images to the policy's square size: one function, so an imported dataset and a deployed robot's
cameras are resized the same way (robot_bridge's `resize` is this function)."""
from __future__ import annotations

import numpy as np


def resize_square(img: np.ndarray, size: int) -> np.ndarray:
    """(h, w, 3) -> (size, size, 3) uint8, bilinear (PIL). Why not pad like openpi: acce policies are trained on
    square renders, so the camera should be framed square; a wrong aspect ratio is better visible than hidden."""
    if img.shape[:2] == (size, size):
        return img.astype(np.uint8)
    from PIL import Image
    return np.array(Image.fromarray(img.astype(np.uint8)).resize((size, size), Image.BILINEAR))  # writable
