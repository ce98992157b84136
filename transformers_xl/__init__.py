"""transformers-xl: Transformer-XL and XLNet as first-class models in transformers v5.

Importing the package registers model type `transfo-xl` with the Auto classes. XLNet keeps transformers'
built-in registration; our XLNet classes are imported from here (see README, "Auto classes").
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .modeling.configuration_transfo_xl import TransfoXLConfig
from .modeling.modeling_transfo_xl import (
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
    TransfoXLPreTrainedModel,
)

AutoConfig.register(TransfoXLConfig.model_type, TransfoXLConfig)
AutoModel.register(TransfoXLConfig, TransfoXLModel)
AutoModelForCausalLM.register(TransfoXLConfig, TransfoXLLMHeadModel)
AutoModelForSequenceClassification.register(TransfoXLConfig, TransfoXLForSequenceClassification)

__all__ = [
    "TransfoXLConfig",
    "TransfoXLPreTrainedModel",
    "TransfoXLModel",
    "TransfoXLLMHeadModel",
    "TransfoXLForSequenceClassification",
]
