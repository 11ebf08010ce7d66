"""Reading the SOW: sow queries (:mod:`.sow`), AMPS filters (:mod:`.filter`) and order-by
(:mod:`.orderby`)."""
