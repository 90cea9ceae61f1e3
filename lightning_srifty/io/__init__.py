"""io layer of lightning-srifty (see DESIGN.md section 3)."""
