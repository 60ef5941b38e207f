# Built with torch: the sinks, then the window starting after them (no duplicates), turned into a list.
import torch


def kept_positions(t, window, n_sink):
    sinks = torch.arange(min(n_sink, t + 1))
    start = max(t - window + 1, len(sinks))
    return torch.cat([sinks, torch.arange(start, t + 1)]).tolist()
