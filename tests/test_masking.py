"""transformer.masking: shapes, dtype and values of the three masks on hand-made examples."""

import pytest
import torch

from transformer.masking import causal_mask, padding_mask, target_mask

PAD = 0  # the tests' own toy vocabulary: id 0 is <pad>, id 1 is <bos>


def test_padding_mask_shape_dtype_and_values():
    ids = torch.tensor([[1, 7, 8, PAD, PAD], [1, 7, 8, 9, 5]])
    mask = padding_mask(ids, PAD)
    assert mask.shape == (2, 1, 1, 5)
    assert mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, True],
    ]


def test_padding_mask_follows_the_given_pad_id():
    ids = torch.tensor([[3, 0, 3, 2]])
    assert padding_mask(ids, pad_id=3)[0, 0, 0].tolist() == [False, True, False, True]


def test_padding_mask_rejects_ids_that_are_not_a_batch():
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        padding_mask(torch.tensor([1, 2, PAD]), PAD)


def test_causal_mask_is_the_lower_triangle_with_the_diagonal():
    mask = causal_mask(3)
    assert mask.shape == (1, 1, 3, 3)
    assert mask.dtype == torch.bool
    assert mask[0, 0].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]


def test_masks_on_the_requested_device():
    # The meta device (shapes, no data) stands in for a GPU: the default, CPU, cannot fail.
    meta = torch.device("meta")
    assert causal_mask(4, device=meta).device == meta
    assert causal_mask(4).device == torch.device("cpu")
    ids = torch.ones(2, 5, dtype=torch.long, device=meta)
    assert padding_mask(ids, PAD).device == meta
    mask = target_mask(ids, PAD)  # follows the ids' device
    assert mask.device == meta and mask.shape == (2, 1, 5, 5)
    assert causal_mask(1).tolist() == [[[[True]]]]


def test_target_mask_values_on_a_hand_made_example():
    ids = torch.tensor([[1, 7, PAD], [1, 7, 8]])
    mask = target_mask(ids, PAD)
    assert mask.shape == (2, 1, 3, 3)
    assert mask.dtype == torch.bool
    assert mask[0, 0].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, False],  # the <pad> query still sees the real tokens before it
    ]
    assert mask[1, 0].tolist() == causal_mask(3)[0, 0].tolist()


def test_no_row_of_a_target_mask_is_fully_masked():
    torch.manual_seed(0)
    ids = torch.randint(1, 9, (4, 7))
    ids[0, 4:] = PAD
    ids[2, 1:] = PAD
    # A padded query always sees position 0 (<bos>), so no row is fully masked.
    assert target_mask(ids, PAD).any(dim=-1).all()


def test_masks_broadcast_to_the_scores_of_every_attention():
    B, H, S, T = 2, 8, 5, 4
    src = torch.ones(B, S, dtype=torch.long)
    tgt = torch.ones(B, T, dtype=torch.long)
    for mask, scores in [
        (padding_mask(src, PAD), (B, H, S, S)),  # encoder self-attention
        (padding_mask(src, PAD), (B, H, T, S)),  # decoder cross-attention
        (target_mask(tgt, PAD), (B, H, T, T)),  # decoder self-attention
    ]:
        assert torch.broadcast_shapes(mask.shape, scores) == scores
