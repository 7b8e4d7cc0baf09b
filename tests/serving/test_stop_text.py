"""Stop strings on hand-made text (serving/text.py), no model: the EARLIEST stop string wins when several occur
in the text one token adds (the cut is where it starts), and held-back text is the longest proper prefix of
any stop string the text ends with."""

from loopspec_jax.serving import text

TOKENS = {1: "Hello", 2: " wor", 3: "ld. END", 4: " STOP", 5: "!"}
decode = lambda ids: "".join(TOKENS[i] for i in ids)


def test_the_earliest_of_several_stop_strings_cuts_the_text():
  assert text.find_stop("a STOP b END c", ["END", "STOP"], 0) == 2
  assert text.find_stop("a STOP b END c", ["END", "STOP"], 3) == 9
  assert text.find_stop("abc", ["x"], 0) is None
  # token 3 brings both "." and "END": the request ends at token 3, cut where "." starts
  assert text.first_stop(decode, [1, 2, 3, 4, 5], ["END", "."], 0) == (3, len("Hello world"))
  assert text.first_stop(decode, [1, 2, 3, 4, 5], ["STOP", "END"], 0) == (3, len("Hello world. "))
  assert text.first_stop(decode, [1, 2], ["END"], 0) is None


def test_held_back_is_the_longest_stop_prefix_at_the_end():
  assert text.held_back("Hello wor", ["world", "or"]) == 3  # "wor" may become "world"
  assert text.held_back("Hello worl", ["world"]) == 4  # every proper prefix, the longest too
  assert text.held_back("Hello wo", ["world"]) == 2
  assert text.held_back("Hello w", ["world", "xyz"]) == 1
  assert text.held_back("Hello", ["world"]) == 0
  assert text.held_back("abc\ufffd", ["world"]) == 1
