"""Which rows of a grid detector a reviewed box is assigned to (``hub.train.grid_targets``)."""

from __future__ import annotations

import numpy as np
import pytest

from edgeagent.hub.train.grid_targets import GridError, assign, grid_of


def _centres(cells: int) -> np.ndarray:
    """Row centres of a ``cells``×``cells`` grid, rows in row-major order, as a decode gives."""
    ys, xs = np.mgrid[0:cells, 0:cells] + 0.5
    return np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float32) / cells


def test_one_grid_is_read_from_its_centres_and_two_scales_are_refused() -> None:
    assert grid_of(_centres(12)) == pytest.approx((1 / 12, 1 / 12), rel=1e-4)
    two_scales = np.concatenate([_centres(12), _centres(6)])
    with pytest.raises(GridError, match="multi-scale"):
        grid_of(two_scales)


def test_a_box_takes_the_three_by_three_cells_round_its_centre_peaking_at_its_own() -> None:
    centres = _centres(12)
    box = np.array([[0.30, 0.30, 0.50, 0.46]], np.float32)  # centre (0.40, 0.38): cell (4, 4)
    scores, targets = assign([box], [np.array([2])], centres, classes=4)
    assigned = np.flatnonzero(scores[0].max(axis=1))
    cells = {(int(i % 12), int(i // 12)) for i in assigned}
    assert cells == {(x, y) for x in (3, 4, 5) for y in (3, 4, 5)}
    assert int(scores[0].max(axis=1).argmax()) == 4 * 12 + 4
    assert set(np.flatnonzero(scores[0].sum(axis=0))) == {2}  # only its class is scored
    assert targets[0, 4 * 12 + 4] == pytest.approx([0.40, 0.38, 0.20, 0.16])


def test_a_cell_two_boxes_reach_goes_to_the_nearer_centre() -> None:
    centres = _centres(12)
    near = np.array([0.30, 0.30, 0.40, 0.40], np.float32)  # centre in cell (4, 4)
    far = np.array([0.48, 0.30, 0.58, 0.40], np.float32)  # centre in cell (6, 4)
    scores, targets = assign([np.stack([far, near])], [np.array([0, 1])], centres, classes=2)
    shared = 4 * 12 + 5  # cell (5, 4): 1 cell from each centre's cell
    nearer = 1 if abs(0.35 - 5.5 / 12) < abs(0.53 - 5.5 / 12) else 0
    assert scores[0, shared].argmax() == nearer
    assert scores[0, shared, 1 - nearer] == 0.0
    assert targets[0, shared, 0] == pytest.approx(0.35 if nearer == 1 else 0.53)
