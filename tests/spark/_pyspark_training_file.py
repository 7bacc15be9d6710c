"""A training script as pyspark's tests run it (python/test_support/test_pytorch_training_file.py):
`script <learning rate> [what a door appends]`, DDP on gloo over whatever ranks it is given."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(learning_rate: float) -> str:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()
    return "success"


if __name__ == "__main__":
    print(train(float(sys.argv[1])))
