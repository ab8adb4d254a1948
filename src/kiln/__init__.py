"""Kiln: pretrain small language models end to end (library half; the DAG lives in workflow/)."""
