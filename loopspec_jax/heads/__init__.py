"""Feature-level draft heads on the looped target (Medusa, EAGLE, MTP): their parameters, training losses and
artefacts. `artefact` saves / loads / checks them; each kind lives in its own module and registers itself."""
