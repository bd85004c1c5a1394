"""acce/threads.py: env groups on threads and the torch thread count they run under."""
import threading

import pytest
import torch

from acce.threads import one_torch_thread, run_threads


@pytest.mark.parametrize("torch_threads", [2], indirect=True)
def test_one_torch_thread_only_for_several_groups_on_the_main_thread(torch_threads):
    restore = one_torch_thread(1)
    assert torch.get_num_threads() == 2  # one group: nothing to overlap, the setting stays
    restore()
    restore = one_torch_thread(2)
    assert torch.get_num_threads() == 1
    restore()
    assert torch.get_num_threads() == 2
    seen = []

    def background():
        restore = one_torch_thread(2)  # a background evaluation shares the process: it changes nothing
        seen.append(torch.get_num_threads())
        restore()

    t = threading.Thread(target=background)
    t.start()
    t.join()
    assert seen == [2] and torch.get_num_threads() == 2


def test_run_threads_keeps_job_order_and_raises_the_first_error_after_all_stop():
    names = run_threads(lambda k: (k, threading.current_thread().name), [(0,), (1,), (2,)], name="g")
    assert [k for k, _ in names] == [0, 1, 2] and {n for _, n in names} == {"g-0", "g-1", "g-2"}
    finished = []

    def job(k):
        if k == 0:
            raise ValueError("group 0 failed")
        finished.append(k)

    with pytest.raises(ValueError, match="group 0 failed"):
        run_threads(job, [(0,), (1,)], name="g")
    assert finished == [1]
