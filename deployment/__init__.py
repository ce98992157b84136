"""Deployment: the models as graphs of their inputs and memory (torch.export, ONNX, ONNX Runtime)."""
