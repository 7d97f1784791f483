"""Which keys each query row sees, as fattn's kernels decide it (Problem::visible_end in
src/model/problem.hpp): the causal limit and the window, both aligned bottom-right
(query i's diagonal at key i + Sk − Sq) unless causal is "top_left". The one boolean form
of that rule the Python references (fattn.triton.reference, fattn.selftest) read."""
from __future__ import annotations

import torch


def visible_pairs(sq: int, sk: int, causal: str | None = None, window_size=(-1, -1),
                  device=None) -> torch.Tensor:
    """(Sq, Sk) bool: key j visible to query i. causal: None, "top_left", "bottom_right";
    window_size (left, right), −1 for no limit on that side."""
    align = 0 if causal == "top_left" else sk - sq
    diagonal = (torch.arange(sk, device=device).view(1, -1)
                - torch.arange(sq, device=device).view(-1, 1))
    visible = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal is not None:
        visible &= diagonal <= align
    left, right = window_size
    if right >= 0:
        visible &= diagonal <= align + right
    if left >= 0:
        visible &= diagonal >= align - left
    return visible
