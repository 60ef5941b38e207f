# One key at a time: rotate slot j by its own change of position.
import torch

from course.rope import rope


def rerotate(k_rot, old_pos, new_pos, theta=10000.0):
    out = []
    for j in range(k_rot.shape[1]):
        shift = (new_pos[j] - old_pos[j]).reshape(1, 1)
        out.append(rope(k_rot[None, :, j : j + 1], shift, theta)[0])
    return torch.cat(out, dim=1)
