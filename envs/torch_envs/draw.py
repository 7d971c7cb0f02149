"""NumPy drawing for the torch-native envs' ``render()``: no pygame, one batch of frames at once.

Every helper works on a batch of N images (N, H, W, 3) uint8 or on a grid of cell colours
(N, R, C, 3), so an env draws all its sub-envs with a handful of array operations.

    >>> cells = np.zeros((2, 3, 5, 3), np.uint8)        # (N, R, C, 3) colours of a 3 x 5 grid
    >>> frames = cells_to_pixels(cells, scale=8)         # (2, 24, 40, 3)
"""

from __future__ import annotations

import colorsys

import numpy as np

__all__ = [
    "BACKGROUND",
    "GRID",
    "bar",
    "cells_to_pixels",
    "fill_box",
    "mark_cells",
    "palette",
    "verdict",
]

BACKGROUND = (255, 255, 255)
GRID = (90, 90, 90)  # the 1-pixel line between cells
# Verdict cells of the answer-grading tasks: the last reward positive, negative, zero.
CORRECT, WRONG, UNGRADED = (40, 180, 60), (220, 50, 40), (170, 170, 170)


def palette(n: int) -> np.ndarray:
    """(n, 3) uint8: ``n`` distinct saturated colours, hues spread evenly around the wheel."""
    rgb = [colorsys.hsv_to_rgb(i / n, 0.75, 0.95) for i in range(n)]
    return (np.asarray(rgb) * 255).round().astype(np.uint8)


def cells_to_pixels(cells: np.ndarray, scale: int) -> np.ndarray:
    """(N, R, C, 3) cell colours -> (N, R * scale, C * scale, 3) pixels with a grid line."""
    image = cells.repeat(scale, axis=1).repeat(scale, axis=2)  # (N, R*s, C*s, 3)
    # The first row and column of every cell is the grid line.
    image[:, ::scale] = GRID
    image[:, :, ::scale] = GRID
    return image


def mark_cells(
    image: np.ndarray, marked: np.ndarray, colour: tuple[int, int, int], scale: int, inset: int
) -> None:
    """Fill the inner square of the cells where ``marked`` (N, R, C) is True, ``inset`` pixels
    in from each edge, in place."""
    inner = np.zeros((scale, scale), dtype=bool)
    inner[inset : scale - inset + 1, inset : scale - inset + 1] = True
    rows, cols = marked.shape[1:]
    pixels = marked.repeat(scale, axis=1).repeat(scale, axis=2)  # (N, R*s, C*s)
    image[pixels & np.tile(inner, (rows, cols))] = colour


def fill_box(
    image: np.ndarray,
    x0: np.ndarray,
    x1: np.ndarray,
    y0: int,
    y1: int,
    colour: tuple[int, int, int],
) -> None:
    """Fill pixel columns ``x0[i] <= x < x1[i]`` (N,) of rows ``y0 <= y < y1`` of image i, in
    place (a rectangle per image, clipped to the image)."""
    xs = np.arange(image.shape[2])
    inside = (xs >= x0[:, None]) & (xs < x1[:, None])  # (N, W)
    band = image[:, y0:y1]  # (N, y1 - y0, W, 3), a view
    band[np.broadcast_to(inside[:, None, :], band.shape[:3])] = colour


def verdict(reward: np.ndarray, answered: np.ndarray) -> np.ndarray:
    """(N, 3) uint8 colours of a verdict cell: green for a positive ``reward`` (N,), red for a
    negative one, grey for 0, background where ``answered`` (N,) is False (after a reset)."""
    sign = np.sign(reward)[:, None]  # (N, 1)
    colour = np.where(sign > 0, CORRECT, np.where(sign < 0, WRONG, UNGRADED))
    return np.where(answered[:, None], colour, BACKGROUND).astype(np.uint8)


def bar(filled: np.ndarray, total: int, width: int) -> np.ndarray:
    """(N, width) bool: a progress bar of ``width`` cells, ``filled / total`` of it set
    (rounded up, so any progress shows), for ``filled`` (N,) in 0..total."""
    cells = -(-filled * width // total)  # ceil(filled * width / total), (N,)
    return np.arange(width)[None, :] < cells[:, None]
