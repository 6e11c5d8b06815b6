"""The ecosystem around a merge: the Hugging Face Hub (``hub``: the source that downloads a snapshot,
the pre-check from remote headers, publishing), mergekit configs in and out (``mergekit``) and the
model cards (``cards``: the merge's card and the evaluation section added to it). The engine, the
methods and storage never import this room; the pipeline and the faces do."""
