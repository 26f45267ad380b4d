from deployments.replicas.stopping import StopMatcher


def run(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    return out + m.flush(), m.stopped


def test_no_stops_pass_through():
    assert run([], ["a", "b"]) == ("ab", False)


def test_stop_inside_one_piece_is_excluded():
    assert run(["END"], ["hello END world"]) == ("hello ", True)


def test_stop_split_across_pieces():
    assert run(["END"], ["hello E", "N", "D and more"]) == ("hello ", True)


def test_false_prefix_is_released():
    assert run(["END"], ["hello E", "NO"]) == ("hello ENO", False)


def test_held_prefix_released_at_flush():
    assert run(["END"], ["hello EN"]) == ("hello EN", False)


def test_earliest_of_several_stops_wins():
    assert run(["b", "xyz"], ["a xyz b"]) == ("a ", True)


def test_nothing_after_stop():
    m = StopMatcher(["."])
    assert m.feed("one. two") == "one"
    assert m.feed("three") == "" and m.flush() == ""


def test_the_stop_that_matched_is_named():
    matcher = StopMatcher(["END", "bc", "abcd"])
    assert matcher.matched is None
    assert matcher.feed("xab") + matcher.feed("cdEND") == "x"
    assert matcher.matched == "abcd"  # the stop that begins first
    assert StopMatcher(["no"]).flush() == "" and StopMatcher(["no"]).matched is None


def test_include_keeps_the_stop_and_cuts_after_it():
    matcher = StopMatcher(["END", "E"], include=True)
    assert matcher.feed("abc EN") + matcher.feed("D tail") == "abc E"  # the first stop to begin is "E"
    matcher = StopMatcher(["stop"], include=True)
    assert matcher.feed("one st") + matcher.feed("op two") + matcher.flush() == "one stop"
    assert matcher.matched == "stop"
