"""The streaming MoE engine: routed experts read from the drives as the router asks for them."""
