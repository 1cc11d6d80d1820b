"""Select the claims to score: a FEVER file, or a generated balanced set."""

from factcheck import read_jsonl, select_claims, write_jsonl

params = snakemake.params
if params.source:
    records = read_jsonl(params.source)
    source = params.source
else:
    from claimgen import generate

    records = generate(params.generated_pool, params.seed)
    source = f"the generated set ({params.generated_pool} claims)"
chosen = select_claims(
    records,
    n_claims=params.n_claims,
    nei=params.nei,
    seed=params.seed,
    calibration_fraction=params.calibration_fraction,
    source=source,
)
write_jsonl(snakemake.output[0], chosen)
