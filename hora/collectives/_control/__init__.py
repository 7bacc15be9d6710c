"""The control room of hora.collectives: what decides which collective runs when.

Horovod's `operations.cc`, `controller.cc`, `response_cache.cc` and `tensor_queue.cc`: the
caller's side (`state`, `process_sets`, `requests`, `sparse`, `submissions`), the loop that owns
the thread (`loop`), each rank's side of a round (`worker_round`, `coordinator_round`,
`responses`), rank 0's decisions (`negotiation`, `validation`, `planning`, `cache`, `stall`) and
the tree they talk over (`tree`, each rank's `relay`, the sockets' `channel`). It hands every
agreed bucket to the data room (`hora.collectives._data`), which never imports it.
"""
