"""Model cards, in one place: ``merge`` writes the merged model's README.md (front matter and the
merge's description); ``evaluation`` adds the "Evaluation" section and ``eval.json`` to it."""
