"""The env spec (docs/design.md §11): built by the env factory, carried by the policy and its checkpoints (older
ones get one derived), and by the episode store's schema."""
import dataclasses

import numpy as np
import pytest

from acce.types import EnvSpec

TABLETOP = EnvSpec(7, 4, "delta_xyz_gripper", 10.0, ("front",), 32, 0.03)
TINY = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
        "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "env.image_size=32",
        "env.tasks=[reach]"]


def test_round_trip_and_one_error_naming_every_difference():
    assert EnvSpec.from_dict(TABLETOP.to_dict()) == TABLETOP
    assert EnvSpec(7, 4, "x", 10, ["wrist", "front"], 32).cameras == ("front", "wrist")  # sorted, like image_keys
    TABLETOP.check_compatible(dataclasses.replace(TABLETOP))
    other = dataclasses.replace(TABLETOP, state_dim=4, control_hz=80.0)
    both = r"state_dim: the policy 7, the env 4; control_hz: the policy 10.0, the env 80.0"
    with pytest.raises(ValueError, match=both):
        TABLETOP.check_compatible(other, "the policy", "the env")
    with pytest.raises(ValueError, match="control_hz=0"):
        dataclasses.replace(TABLETOP, control_hz=0)
    with pytest.raises(ValueError, match="missing keys"):
        EnvSpec.from_dict({"state_dim": 7})


def test_the_sim_vector_env_says_its_spec():
    from acce.config import load
    from acce.wiring import env_spec
    assert env_spec(load(None, TINY)) == TABLETOP
    privileged = env_spec(load(None, TINY + ["env.privileged_state=true"]))
    assert privileged.state_dim > 7 and dataclasses.replace(privileged, state_dim=7) == TABLETOP


def test_policy_carries_its_spec_and_old_states_derive_one():
    from acce.config import load
    from acce.policy.build import build_policy
    from acce.policy.vla import VLAPolicy

    cfg = load(None, TINY)
    policy = build_policy(cfg, np.zeros((4, 7), np.float32), spec=TABLETOP, aux_dim=0, privileged_dim=0)
    assert policy.env_spec == TABLETOP and policy.norm.action_repr["control_hz"] == 10.0
    state = policy.policy_state()
    assert VLAPolicy.from_state(state).env_spec == TABLETOP
    old = {k: v for k, v in state.items() if k != "env_spec"}  # saved before policies carried a spec
    assert VLAPolicy.from_state(old, image_size=32).env_spec == TABLETOP
    assert VLAPolicy.from_state(old).env_spec is None  # no image size known: it still loads and acts
    with pytest.raises(ValueError, match="env spec has state 4"):
        VLAPolicy(cfg.policy, 7, 4, policy.norm, env_spec=dataclasses.replace(TABLETOP, state_dim=4))


def test_store_schema_builds_from_and_yields_the_spec(tmp_path):
    from acce.store.episodes import EpisodeStore
    from acce.store.schema import StoreSchema

    store = EpisodeStore.create(tmp_path / "s.zarr", **StoreSchema.fields_for(TABLETOP, aux_dim=3))
    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert reopened.schema == StoreSchema.from_spec(TABLETOP, aux_dim=3) and reopened.schema.env_spec == TABLETOP
    # a store written before the spec (no action representation) reopens for the spec's episodes
    plain = EpisodeStore.create(tmp_path / "old.zarr", image_shapes={"front": (32, 32)}, state_dim=7, action_dim=4,
                                control_hz=10.0)
    assert plain.schema.env_spec.action_repr == "normalized"
    assert EpisodeStore.open_or_create(tmp_path / "old.zarr", **StoreSchema.fields_for(TABLETOP)).path == plain.path
    assert store.schema.mismatch(StoreSchema.from_spec(dataclasses.replace(TABLETOP, action_repr="joint_pos_abs"),
                                                       aux_dim=3)).startswith("action_repr")
