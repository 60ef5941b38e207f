# F.pad on the left with the sink's id as the fill value.
import torch.nn.functional as F


def prepend_sink(x, sink_id):
    return F.pad(x, (1, 0), value=sink_id)
