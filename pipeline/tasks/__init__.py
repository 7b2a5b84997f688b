"""What is asked and how an answer is scored: arithmetic and GSM-Symbolic problems, benchmark sources, prompts, the
boxed-answer extractor, graders, rewards and the gold audit."""
