"""A test double of Megatron-FSDP main on top of megatron-fsdp 0.6.1: what main changed that a
checkpointer must live with. Every sharded parameter keeps its FsdpParameterGroup as a
`weakref.ref` in `_mfsdp_parameter_group` (Megatron-LM 19c50e86), and every optimizer step
replaces each group's `model_weight` DBuffer with a new one before casting into it (01dc20b4), so
a model_weight looked up before a step is never read again; groups list their parameters as
main does, in `fsdp_parameters` records. Test support only."""

import collections
import contextlib
import weakref

ATTR = "_mfsdp_parameter_group"
# main's per-parameter record in FsdpParameterGroup.fsdp_parameters.
FsdpParameter = collections.namedtuple("FsdpParameter", "fqns sharded unsharded")


def _deref(parameter):
    ref = getattr(parameter, ATTR, None)
    return ref() if isinstance(ref, weakref.ref) else ref


def _modules():
    from megatron_fsdp.experimental import module, optimizer, parameter_group
    return module, optimizer, parameter_group


@contextlib.contextmanager
def main_style():
    """Megatron-FSDP's own lookups dereference the weak reference, as main's do."""
    saved = [m.get_containing_parameter_group for m in _modules()]
    install()
    try:
        yield
    finally:
        for m, f in zip(_modules(), saved):
            m.get_containing_parameter_group = f


def install():
    """main_style() for the rest of this process (a worker's)."""
    for m in _modules():
        m.get_containing_parameter_group = _deref


def make_main_style(model):
    """Turns a 0.6.1-sharded model into the main-style double (call inside main_style())."""
    from megatron_fsdp.experimental.dbuffer import DBuffer
    groups = []
    for m in model.modules():
        groups += list(getattr(m, "_parameter_groups", ()) or ())
    model._main_double_groups = groups  # the strong references main's modules hold

    for group in groups:
        group.fsdp_parameters = tuple(
            FsdpParameter((name,), s, u) for name, s, u in
            zip(group.parameter_names, group.sharded_parameters, group.unsharded_parameters))
        for p in tuple(group.sharded_parameters) + tuple(group.unsharded_parameters):
            setattr(p, ATTR, weakref.ref(group))
        if group.model_weight is group.main_weight:
            continue
        cast = group.sync_model_weight_from_main_weight

        def sync(group=group, cast=cast):
            old = group.model_weight
            group.model_weight = DBuffer(mesh=old.mesh, placements=old.placements,
                                         tensor_shapes=group.main_weight.layout.tensor_shapes,
                                         dtype=old.dtype, device=old.device)
            old.local_buffer.fill_(float("nan"))  # whoever still reads it gets garbage
            cast()

        group.sync_model_weight_from_main_weight = sync
    return model
