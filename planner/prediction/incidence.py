"""A sparse matrix as its nonzero entries: the prediction's paths x nodes and paths x links."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Incidence:
    """A sparse matrix as its nonzero entries (each (row, col) once): a path meets a few of a
    large cluster's nodes, and the dense paths x nodes arrays (thousands x 1,000 at 1,000 nodes,
    multiplied up to 2N+1 times per filling) took minutes. Products by bincount, no scipy."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple[int, int]

    @staticmethod
    def of(entries: set[tuple[int, int]], shape: tuple[int, int]) -> Incidence:
        """Ones at ``entries``, in sorted order (so sums come out the same every run)."""
        ordered = sorted(entries)
        return Incidence(np.array([i for i, _ in ordered], dtype=np.intp),
                         np.array([j for _, j in ordered], dtype=np.intp),
                         np.ones(len(ordered)), shape)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(self.rows, weights=self.vals * np.asarray(x, float)[self.cols],
                           minlength=self.shape[0])

    @property
    def T(self) -> Incidence:
        return Incidence(self.cols, self.rows, self.vals, (self.shape[1], self.shape[0]))

    def scale_columns(self, v: np.ndarray) -> Incidence:
        """The matrix times ``v`` column-wise (``dense * v`` with ``v`` broadcast along rows)."""
        return Incidence(self.rows, self.cols, self.vals * v[self.cols], self.shape)

    def columns_in(self, row_mask: np.ndarray) -> np.ndarray:
        """Columns with a positive entry in some row of ``row_mask``."""
        out = np.zeros(self.shape[1], dtype=bool)
        out[self.cols[row_mask[self.rows] & (self.vals > 0)]] = True
        return out

    def row_max(self, v: np.ndarray) -> np.ndarray:
        """Per row, max(0, max of entry x v[col]): ``np.max(dense * v, axis=1)`` for ``v >= 0``."""
        out = np.zeros(self.shape[0])
        np.maximum.at(out, self.rows, self.vals * v[self.cols])
        return out

