"""The piece all-gather's wire form (pure): a rank's shard pieces as an int64 table and raw bytes
round-trip, and every row that does not fit the model is refused before a byte is read."""

from __future__ import annotations

import numpy as np
import pytest

from nereus.errors import CommunicationError
from nereus.runtime.worker.piece_gather import HEAD, decode, encode, limits

SHAPES = {"b": (6,), "w": (4, 3)}
FIELDS = ("param", "exp_avg")


def _pieces() -> list[tuple[str, str, tuple[int, ...], tuple[int, ...], np.ndarray]]:
    rng = np.random.default_rng(0)
    return [("param", "w", (0, 0), (2, 3), rng.standard_normal((2, 3)).astype(np.float32)),
            ("exp_avg", "b", (1,), (4,), np.arange(3, dtype=np.float64)),
            ("param", "b", (5,), (6,), np.array([7], dtype=np.int64)),
            ("param", "w", (2, 1), (2, 1), np.zeros((0, 0), dtype=np.float16))]


def test_pieces_round_trip_with_their_dtypes_boxes_and_values() -> None:
    pieces = _pieces()
    table, data = encode(pieces, SHAPES, FIELDS)
    assert table.dtype == np.int64 and data.dtype == np.uint8
    got = decode(table, data, SHAPES, FIELDS)
    assert len(got) == len(pieces)
    for (f, n, a, b, arr), (f2, n2, a2, b2, arr2) in zip(pieces, got, strict=True):
        assert (f, n, a, b) == (f2, n2, a2, b2)
        assert arr2.dtype == arr.dtype and arr2.shape == arr.shape
        np.testing.assert_array_equal(arr2, arr)
    assert decode(*encode([], SHAPES, FIELDS), SHAPES, FIELDS) == []


@pytest.mark.parametrize("piece", [
    ("grad", "w", (0, 0), (1, 1), np.zeros((1, 1), np.float32)),      # unknown field
    ("param", "x", (0,), (1,), np.zeros(1, np.float32)),              # unknown tensor
    ("param", "w", (0, 0), (5, 1), np.zeros((5, 1), np.float32)),     # outside the tensor
    ("param", "w", (0, 0), (1, 1), np.zeros((2, 1), np.float32)),     # values of another box
    ("param", "b", (0,), (1,), np.zeros(1, np.complex64)),            # a dtype not sent
])
def test_a_piece_receivers_would_refuse_is_not_sent(piece: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError):
        encode([piece], SHAPES, FIELDS)


def _tampered(col: int, value: int) -> tuple[np.ndarray, np.ndarray]:
    table, data = encode(_pieces()[:1], SHAPES, FIELDS)
    table[0, col] = value
    return table, data


@pytest.mark.parametrize(("col", "value", "words"), [
    (0, 2, "field 2"), (0, -1, "field -1"), (1, 9, "tensor 9"), (2, 99, "dtype 99"),
    (3, 1, "outside"), (HEAD + 2, 5, "outside"), (HEAD, 3, "outside"),  # ndim, stop, start
    (HEAD + 2, 4, "overrun"),  # a box of more bytes than were sent
    (2, 1, "overrun"),  # float64 values: twice the bytes of the float32 sent
])
def test_a_row_that_does_not_fit_the_model_is_refused(col: int, value: int, words: str) -> None:
    table, data = _tampered(col, value)
    with pytest.raises(CommunicationError, match=words):
        decode(table, data, SHAPES, FIELDS, "group rank 1")


def test_a_table_of_another_width_and_the_limits() -> None:
    table, data = encode(_pieces(), SHAPES, FIELDS)
    with pytest.raises(CommunicationError, match="shape"):
        decode(table[:, :-1], data, SHAPES, FIELDS)
    rows, nbytes = limits(SHAPES, FIELDS)
    assert rows >= len(table) and nbytes >= data.size
    assert nbytes == 8 * 2 * (6 + 12) + 8 * rows
