"""transformers-xl: Transformer-XL and XLNet as first-class models in transformers v5.

Importing the package registers model type `transfo-xl` with the Auto classes. XLNet keeps transformers'
built-in registration; our XLNet classes are imported from here (see README, "Auto classes").
"""

from transformers import AutoConfig

from .modeling.configuration_transfo_xl import TransfoXLConfig

AutoConfig.register(TransfoXLConfig.model_type, TransfoXLConfig)

__all__ = ["TransfoXLConfig"]
