"""Hugging Face interop: GPT-2, Llama and NanoChat layouts converted to and from gptlab's model, and the
files of a Hugging Face model directory (config.json, safetensors, tokenizer) read and written."""
