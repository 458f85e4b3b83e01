"""rewards.drift: the image-statistics drift of eval.guard, against values computed by hand on tiny images."""

import pytest
import torch

from digenrl.rewards.drift import ImageStats, colour_histogram, drift, flat_fraction, image_stats, mean_saturation


def checkerboard(n=1, c=3, h=8, w=8):
    """0 / 1 alternating pixels (grey): every 4 x 4 tile has std 0.5, half its values in each half of [0, 1]."""
    ij = torch.arange(h)[:, None] + torch.arange(w)[None, :]
    return (ij % 2).double().expand(n, c, h, w).clone()


def test_identical_images_give_no_drift():
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    d = drift(image_stats(x), image_stats(x.clone()))
    assert d == {"drift": 1.0, "hist": 0.0, "saturation": 0.0, "uniformity": 0.0}


def test_blanked_background_moves_uniformity():
    base = checkerboard()
    hacked = base.clone()
    hacked[:, :, :, :] = 0.5  # the background blanked ...
    hacked[:, :, :4, :4] = base[:, :, :4, :4]  # ... around one textured 4 x 4 tile (the "text")
    ref, cur = image_stats(base, bins=2, patch=4), image_stats(hacked, bins=2, patch=4)
    # base: no tile is flat; hacked: 3 of 4 tiles are (std 0 < 0.02)
    assert (ref.uniformity, cur.uniformity) == (0.0, 0.75)
    # histograms, 2 bins: base [1/2, 1/2] per channel; hacked: 8 zeros in bin 0, 8 ones + 48 halves in bin 1
    assert torch.equal(ref.hist, torch.full((3, 2), 0.5, dtype=torch.float64))
    assert torch.equal(cur.hist, torch.tensor([[0.125, 0.875]] * 3, dtype=torch.float64))
    d = drift(ref, cur)
    assert d["uniformity"] == 0.75
    assert d["hist"] == pytest.approx(0.5 * (0.375 + 0.375))  # total variation per channel, averaged
    assert d["saturation"] == 0.0  # grey: max_c = min_c
    assert d["drift"] == pytest.approx(1 - 0.75)  # 1 - max(hist, |saturation|, |uniformity|)


def test_histogram_by_hand():
    x = torch.tensor([0.0, 0.3, 0.6, 1.0], dtype=torch.float64).reshape(1, 1, 2, 2)
    assert colour_histogram(x, 2).tolist() == [[0.5, 0.5]]  # 1.0 falls in the last bin
    assert colour_histogram(x, 4).tolist() == [[0.25, 0.25, 0.25, 0.25]]


def test_saturation_by_hand():
    red = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).reshape(1, 3, 1, 1).expand(1, 3, 2, 2)
    dull = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).reshape(1, 3, 1, 1).expand(1, 3, 2, 2)
    black = torch.zeros(1, 3, 2, 2, dtype=torch.float64)
    assert mean_saturation(red) == 1.0
    assert mean_saturation(dull) == 0.5  # (0.5 - 0.25) / 0.5
    assert mean_saturation(black) == 0.0  # max_c = 0: 0, not NaN
    assert mean_saturation(torch.cat([red, dull])) == 0.75
    assert mean_saturation(torch.rand(2, 1, 4, 4)) == 0.0  # one channel
    d = drift(image_stats(red), image_stats(dull))
    assert d["saturation"] == -0.5 and d["drift"] == pytest.approx(1 - max(d["hist"], 0.5))


def test_flat_fraction_threshold_and_patch():
    x = torch.zeros(1, 1, 4, 6, dtype=torch.float64)
    x[..., :2, :2] = torch.tensor([[0.0, 0.1], [0.0, 0.1]], dtype=torch.float64)  # std 0.05
    assert flat_fraction(x, 2, 0.02) == 5 / 6  # 2 x 3 tiles, one textured
    assert flat_fraction(x, 2, 0.06) == 1.0  # std 0.05 < 0.06: flat
    assert flat_fraction(x, 100, 0.02) == 0.0  # patch capped at 4: tiles 4 x 4, the remainder columns dropped


def test_video_frames_count_as_images_and_stats_round_trip():
    v = torch.rand(2, 3, 5, 8, 8, generator=torch.Generator().manual_seed(1))
    frames = v.permute(0, 2, 1, 3, 4).reshape(10, 3, 8, 8)
    a, b = image_stats(v), image_stats(frames)
    assert torch.equal(a.hist, b.hist) and a.saturation == b.saturation and a.uniformity == b.uniformity
    back = ImageStats.from_dict(a.as_dict())
    assert drift(a, back)["drift"] == 1.0
    with pytest.raises(ValueError, match="eval.guard.drift"):
        drift(image_stats(v, bins=4), a)
