"""measure: what a rank measures about itself (memory by category, device synchronisation).

Below comm/ and parallel/, which use it; it imports neither.
"""
