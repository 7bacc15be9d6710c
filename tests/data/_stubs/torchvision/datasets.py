"""`VisionDataset` and `CIFAR10` as streaming's vision datasets name them."""

from torch.utils.data import Dataset


class VisionDataset(Dataset):
    """The base class streaming's vision datasets list beside StreamingDataset."""

    def __init__(self, root: str = "", transforms=None, transform=None, target_transform=None):
        self.root = root
        self.transform = transform
        self.target_transform = target_transform


class CIFAR10(VisionDataset):
    """Named by streaming's CIFAR-10 converter; reading CIFAR-10 needs the real torchvision."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("the torchvision stand-in cannot read CIFAR-10: install torchvision")
