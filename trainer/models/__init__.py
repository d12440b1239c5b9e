"""Models: what a spec's model name resolves to (resolve), Hub ids (hub), `rlvr models pull` (pull), loading
policy and reference (load), and the two bundled tiny models (tiny_arith, tiny_code) with their assets."""
