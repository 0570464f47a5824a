"""Parameters packed by hand (or by a framework not known here): views of packed buffers, with
compute weights and gradients passed to attach as buffers= or allocated by it."""

from . import Adapter


class Packed(Adapter):
    name = "packed tensors"
