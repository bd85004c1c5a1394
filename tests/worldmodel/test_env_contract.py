"""One contract, two envs: the simulator's vector env and the world model's ImaginedEnv."""
from env_contract import check_vector_env_contract
from wm_helpers import fake_episode, tiny_model

from worldmodel.imagined_env import ImaginedEnv


def test_sim_vector_env_meets_the_contract():
    from sim.vector_env import SimVectorEnv
    check_vector_env_contract(SimVectorEnv(["reach"], 2, image_size=32))


def test_imagined_env_meets_the_contract():
    episodes = [fake_episode(5 + k, seed=k, task_id=k % 2) for k in range(4)]
    check_vector_env_contract(ImaginedEnv(tiny_model(), 3, start_episodes=episodes))
