"""Opt-in: transformers' Auto classes give our XLNet classes for model type "xlnet", in this process. Importing the
package leaves transformers' built-in XLNet in place (docs/xlnet.md, "Auto classes")."""

import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .modeling import modeling_xlnet
from .modeling.configuration_xlnet import XLNetConfig

# Which of our classes each Auto class gives for model type "xlnet" (transformers' own XLNet mapping, same names).
AUTO_CLASSES = {
    "AutoModel": "XLNetModel",
    "AutoModelForPreTraining": "XLNetLMHeadModel",
    "AutoModelForCausalLM": "XLNetLMHeadModel",
    "AutoModelForSequenceClassification": "XLNetForSequenceClassification",
    "AutoModelForTokenClassification": "XLNetForTokenClassification",
    "AutoModelForMultipleChoice": "XLNetForMultipleChoice",
    "AutoModelForQuestionAnswering": "XLNetForQuestionAnsweringSimple",
}


def use_for_auto_classes():
    """Make `AutoConfig` / `AutoModel*` give these classes for model type "xlnet", in this process (opt-in; undo with
    `use_builtin_auto_classes`)."""
    transformers.AutoConfig.register(XLNetConfig.model_type, XLNetConfig, exist_ok=True)
    for auto_name, class_name in AUTO_CLASSES.items():
        getattr(transformers, auto_name).register(XLNetConfig, getattr(modeling_xlnet, class_name), exist_ok=True)


def use_builtin_auto_classes():
    """Give model type "xlnet" back to transformers' built-in XLNet in the Auto classes."""
    if CONFIG_MAPPING._extra_content.get(XLNetConfig.model_type) is XLNetConfig:
        del CONFIG_MAPPING._extra_content[XLNetConfig.model_type]
    for auto_name in AUTO_CLASSES:
        getattr(transformers, auto_name)._model_mapping._extra_content.pop(XLNetConfig, None)
