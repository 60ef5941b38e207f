# Undo the old rotation (rotate by -old), then rotate at the new positions: two calls of rope.
from course.models.llama import rope


def rerotate(k_rot, old_pos, new_pos, theta=10000.0):
    plain = rope(k_rot.unsqueeze(0), -old_pos.unsqueeze(0), theta)
    return rope(plain, new_pos.unsqueeze(0), theta).squeeze(0)
