"""Saving any of our models also saves its code, so the folder loads where transformers_xl is not installed.

transformers' own mechanism does the work: a class registered with `register_for_auto_class` has its module file
(and the sibling files it imports) copied beside the weights by `save_pretrained` / `push_to_hub`, and an `auto_map`
entry written into `config.json`; `AutoModel*.from_pretrained(folder, trust_remote_code=True)` then runs that code.
Two traps of that mechanism are closed here: the registration is inherited by subclasses (a user's subclass would
ship the user's own file), so it holds for the registered class only; and it names one Auto class per model class,
so the converter adds the other heads of the same file with `full_auto_map`.
"""

from ..modeling import modeling_transfo_xl, modeling_xlnet
from ..modeling.configuration_transfo_xl import TransfoXLConfig
from ..modeling.configuration_xlnet import XLNetConfig
from ..xlnet_auto_classes import AUTO_CLASSES as XLNET_AUTO_CLASSES

# Model type -> (config class, the module holding every head, {Auto class: head it gives}).
AUTO_CLASSES = {
    TransfoXLConfig.model_type: (
        TransfoXLConfig,
        modeling_transfo_xl,
        {
            "AutoModel": "TransfoXLModel",
            "AutoModelForCausalLM": "TransfoXLLMHeadModel",
            "AutoModelForSequenceClassification": "TransfoXLForSequenceClassification",
        },
    ),
    XLNetConfig.model_type: (XLNetConfig, modeling_xlnet, XLNET_AUTO_CLASSES),
}

# Every concrete head -> the Auto class whose `auto_map` entry names it in a folder saved from it.
OWN_AUTO_CLASS = {
    "TransfoXLModel": "AutoModel",
    "TransfoXLLMHeadModel": "AutoModelForCausalLM",
    "TransfoXLForSequenceClassification": "AutoModelForSequenceClassification",
    "XLNetModel": "AutoModel",
    "XLNetLMHeadModel": "AutoModelForCausalLM",
    "XLNetForSequenceClassification": "AutoModelForSequenceClassification",
    "XLNetForTokenClassification": "AutoModelForTokenClassification",
    "XLNetForMultipleChoice": "AutoModelForMultipleChoice",
    "XLNetForQuestionAnsweringSimple": "AutoModelForQuestionAnswering",
    "XLNetForQuestionAnswering": "AutoModelForQuestionAnswering",  # (no Auto class gives it by default)
}


class _RegisteredClassOnly:
    """`_auto_class` on the class it was registered for; None on its subclasses (they are someone else's code and
    register themselves with `register_for_auto_class` if they want to be shipped)."""

    def __init__(self, auto_class: str, owner: type):
        self.auto_class, self.owner = auto_class, owner

    def __get__(self, instance, owner):
        return self.auto_class if owner is self.owner else None


def register_remote_code():
    """Register every concrete config and model class for remote code (idempotent; the package does it on import)."""
    for config_class, module, _ in AUTO_CLASSES.values():
        config_class._auto_class = _RegisteredClassOnly("AutoConfig", config_class)
        for class_name, auto_class in OWN_AUTO_CLASS.items():
            if hasattr(module, class_name):
                model_class = getattr(module, class_name)
                model_class._auto_class = _RegisteredClassOnly(auto_class, model_class)


def full_auto_map(model) -> dict[str, str]:
    """`auto_map` for every Auto class of the model's kind, the model's own Auto class naming the model's head."""
    config_class, module, auto_classes = AUTO_CLASSES[model.config.model_type]
    modeling_file = module.__name__.rsplit(".", 1)[-1]
    configuration_file = config_class.__module__.rsplit(".", 1)[-1]
    auto_map = {"AutoConfig": f"{configuration_file}.{config_class.__name__}"}
    auto_map.update({auto: f"{modeling_file}.{name}" for auto, name in auto_classes.items()})
    auto_map[OWN_AUTO_CLASS[type(model).__name__]] = f"{modeling_file}.{type(model).__name__}"
    return auto_map
