"""transformers-xl: Transformer-XL and XLNet as first-class models in transformers v5.

Importing the package registers model type `transfo-xl` with the Auto classes. XLNet keeps transformers'
built-in registration; our XLNet classes are imported from here (see docs/xlnet.md, "Auto classes"). It also registers
every model class for remote code, so that `save_pretrained` / `push_to_hub` write folders that load with
`trust_remote_code=True` where this package is not installed.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from .modeling.configuration_transfo_xl import TransfoXLConfig
from .modeling.modeling_transfo_xl import (
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
    TransfoXLPreTrainedModel,
)
from .tokenization.tokenization_transfo_xl import TransfoXLTokenizer
from .modeling.configuration_xlnet import XLNetConfig
from .modeling.modeling_xlnet import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForQuestionAnsweringSimple,
    XLNetForSequenceClassification,
    XLNetForTokenClassification,
    XLNetLMHeadModel,
    XLNetModel,
    XLNetPreTrainedModel,
)
from .xlnet_auto_classes import use_builtin_auto_classes, use_for_auto_classes
from .conversion.remote_code import register_remote_code

AutoConfig.register(TransfoXLConfig.model_type, TransfoXLConfig)
AutoModel.register(TransfoXLConfig, TransfoXLModel)
AutoModelForCausalLM.register(TransfoXLConfig, TransfoXLLMHeadModel)
AutoModelForSequenceClassification.register(TransfoXLConfig, TransfoXLForSequenceClassification)
AutoTokenizer.register(TransfoXLConfig, tokenizer_class=TransfoXLTokenizer)
# save_pretrained / push_to_hub of any of our models also save its code (see conversion/remote_code.py).
register_remote_code()

__all__ = [
    "TransfoXLConfig",
    "TransfoXLPreTrainedModel",
    "TransfoXLModel",
    "TransfoXLLMHeadModel",
    "TransfoXLForSequenceClassification",
    "TransfoXLTokenizer",
    "XLNetConfig",
    "XLNetPreTrainedModel",
    "XLNetModel",
    "XLNetLMHeadModel",
    "XLNetForSequenceClassification",
    "XLNetForTokenClassification",
    "XLNetForMultipleChoice",
    "XLNetForQuestionAnsweringSimple",
    "XLNetForQuestionAnswering",
    "use_for_auto_classes",
    "use_builtin_auto_classes",
]
