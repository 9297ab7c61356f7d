"""Layer offload: layers whose weights do not fit the device stay in host memory and stream in as they run.

    offload_layers(model, [8, 9, 10, 11])      # those layers' weights move to (pinned) host memory

Each offloaded layer is replaced by an `OffloadedBlock`; two device-resident staging blocks take turns holding
offloaded layers. When an offloaded layer runs, the copy of the next offloaded layer into the other staging block
is already under way on a side CUDA stream, overlapping copy and compute; the side stream waits until the compute
stream has finished with that staging block. Self-speculative passes that run a subset of layers work too: a staging
block that holds the wrong layer is simply refilled. The draft path (a separate draft model, or early exits below the
offloaded layers) never waits for a copy.

On a CPU-only machine there is nothing to offload to; the same code runs with plain copies (which is how the tests
check it), and the memory planner never asks for it there.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.model.transformer import Block, Transformer


class LayerStreamer(nn.Module):
    def __init__(self, model: Transformer, offloaded: list[int], device: torch.device | str | None = None) -> None:
        """`device`: where the layers compute (default: the model's); the model may still be on the CPU, as when it
        is loaded there to be split before the rest moves to the GPU."""
        super().__init__()
        self.device = torch.device(device) if device is not None else model.device
        self.cuda = self.device.type == "cuda"
        self.order = sorted(offloaded)
        config = model.config
        # staging blocks (moved to the device with the model), their projections bound to the model's kernel runner
        self.slots = nn.ModuleList(Block(config, model.linears, device="meta") for _ in range(min(2, len(self.order))))
        self.host: dict[int, dict[str, torch.Tensor]] = {}
        template = model.layers[self.order[0]].state_dict()
        for slot in self.slots:
            slot.load_state_dict({name: torch.empty_like(t) for name, t in template.items()}, assign=True)
        for layer in self.order:
            state = model.layers[layer].state_dict()
            self.host[layer] = {name: (t.detach().to("cpu").pin_memory() if self.cuda else t.detach().clone())
                                for name, t in state.items()}
            model.layers[layer] = OffloadedBlock(layer, self)
        self.held: list[int | None] = [None] * len(self.slots)  # which layer each staging block holds
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.ready: list = [None] * len(self.slots)  # CUDA events: copy into the slot finished
        self.free: list = [None] * len(self.slots)  # CUDA events: compute with the slot finished

    def host_bytes(self) -> int:
        return sum(t.nbytes for state in self.host.values() for t in state.values())

    def acquire(self, layer: int) -> Block:
        """The staging block holding `layer`'s weights (filled now if the prefetch did not bring it), and the
        prefetch of the next offloaded layer into the other block."""
        slot = self.order.index(layer) % len(self.slots)
        if self.held[slot] != layer:
            self._fill(slot, layer, prefetch=False)
        elif self.cuda and self.ready[slot] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        following = self.order[(self.order.index(layer) + 1) % len(self.order)]
        other = self.order.index(following) % len(self.slots)
        if other != slot and self.held[other] != following:
            self._fill(other, following, prefetch=True)
        return self.slots[slot]

    def release(self, layer: int) -> None:
        if self.cuda:
            slot = self.order.index(layer) % len(self.slots)
            self.free[slot] = torch.cuda.current_stream(self.device).record_event()

    def _fill(self, slot: int, layer: int, prefetch: bool) -> None:
        targets = self.slots[slot].state_dict()
        if not self.cuda:
            for name, tensor in self.host[layer].items():
                targets[name].copy_(tensor)
        else:
            stream = self.stream if prefetch else torch.cuda.current_stream(self.device)
            if prefetch and self.free[slot] is not None:
                stream.wait_event(self.free[slot])  # the compute stream is done with this staging block
            with torch.cuda.stream(stream):
                for name, tensor in self.host[layer].items():
                    targets[name].copy_(tensor, non_blocking=True)
                self.ready[slot] = stream.record_event()
        self.held[slot] = layer


class OffloadedBlock(nn.Module):
    """Stands in for an offloaded layer: runs the staging block that holds its weights."""

    def __init__(self, layer: int, streamer: LayerStreamer) -> None:
        super().__init__()
        self.layer = layer
        self._streamer = [streamer]  # a list, so the streamer is not registered twice as a submodule

    def forward(self, x, layer, start, cache, rope, mask) -> torch.Tensor:
        streamer = self._streamer[0]
        block = streamer.acquire(self.layer)
        out = block(x, layer, start, cache, rope, mask)
        streamer.release(self.layer)
        return out


def offload_layers(model: Transformer, layers: list[int], device: torch.device | str | None = None
                   ) -> LayerStreamer | None:
    """Move `layers`' weights to host memory and stream them in when they run on `device`; returns the streamer
    (None if there is nothing to offload). Then move the model to `device`: the staging blocks go with it."""
    if not layers:
        return None
    bad = [layer for layer in layers if not 0 <= layer < model.config.num_layers]
    if bad:
        raise ValueError(f"cannot offload layer {bad[0]}: the model has layers 0..{model.config.num_layers - 1}")
    streamer = LayerStreamer(model, layers, device)
    model.streamer = streamer  # registered: its staging blocks count in model.weight_bytes()
    return streamer
