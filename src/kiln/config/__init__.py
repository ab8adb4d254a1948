"""A run's config: what the user wrote, resolved once, and what each setting means to each stage.

    files     which files make a run, merged as Snakemake merges them, and the --config overrides
    declare   how a setting is declared: once, as a field of its section's model (type, default,
              bounds, description, the stages it reruns); the section models:
      data_sections   download (and its sources), tokenizer, pretokenize, shard
      smoke_section, train_sections, eval_sections
      run_config      model, plan, wandb, and RunConfig, which holds every section
    schema    validation against RunConfig (defaults filled in, errors by key path), every leaf, and
              the JSON Schema generated from the models (workflow/schemas/config.schema.json)
    rules     what a field cannot say alone: rules between sections, a model the registry can build,
              a batch that splits over the ranks, a vocabulary that holds the special tokens
    resolve   validate = schema + rules, once; resolve (a run), resolve_experiment (a sweep's runs),
              load (one file), stage_sections (a config built in Python: benches, tests)
    sweep     one config, several runs (arms)
    settings  what each setting means to each stage, from the declarations: each rule's params, the
              train fingerprint, the data folders' keys and docs/settings.md
    models    named model flavours (each with its source URL) and the ModelConfig derived from them
    hf_source the ModelConfig (and model section) of a Hugging Face checkpoint's config.json, for
              train.init_from: {hf: FOLDER}
    batch     the one derived split of a step: ranks x accumulation x micro-batch x seq_len
    special_tokens  the tokens every vocabulary holds

Torch-free and at the bottom of the package (kiln.errors and kiln.io below it): the Snakefile, `kiln
plan` and `kiln status` import it without importing torch.
"""

from kiln.config.files import EMBEDDED_DEFAULT, merge, raw_config, read_yaml
from kiln.config.resolve import Experiment, load, resolve, resolve_experiment, stage_sections, validate
from kiln.config.rules import checkpoint_format
from kiln.config.run_config import RunConfig
from kiln.errors import ConfigError

__all__ = [
    "EMBEDDED_DEFAULT",
    "ConfigError",
    "Experiment",
    "RunConfig",
    "checkpoint_format",
    "load",
    "merge",
    "raw_config",
    "read_yaml",
    "resolve",
    "resolve_experiment",
    "stage_sections",
    "validate",
]
