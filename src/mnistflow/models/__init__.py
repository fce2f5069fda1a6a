"""Models registered by name; ``create_model`` also accepts a layer spec string."""
from mnistflow.models.registry import (create_model, get_entry, list_models, parameter_count,
                                       register_model)

# Importing the families registers their models.
from mnistflow.models import cnn, fast, mlp, resnet, vgg  # noqa: E402,F401

__all__ = ["create_model", "get_entry", "list_models", "parameter_count", "register_model"]
