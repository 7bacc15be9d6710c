"""`transforms.functional.to_tensor`, as streaming's vision base imports it."""

from torchvision.transforms import functional as functional
