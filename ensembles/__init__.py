"""Combining predictions: fold averaging now; weighted blends, hill climbing and stacking later."""
