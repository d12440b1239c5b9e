r"""Hand-built case table for the math verifier (shared by tests/test_math_verifier.py and
bench/math_verifier.py). Each row is (category, gold, prediction, expected):

- outside the "extract" category the prediction is the content of the final box and the test wraps
  it in a short chain of thought (`... so the answer is $\boxed{pred}$.`);
- in "extract", "completions" and "gsm8k" the prediction is the whole completion;
- expected is "correct", "wrong", "unparseable", or "fail" (pathological input that is not the
  answer: wrong, timeout or unparseable are all fine, as long as it comes back quickly).

Positives and near-miss negatives sit side by side so that a lenient checker cannot pass by
saying yes to everything.
"""
T, F, U = "correct", "wrong", "unparseable"

NUMBERS = [
    ("19", "19", T), ("19", "19.0", T), ("19", "18", F), ("19", "-19", F), ("0", "0", T),
    ("0", "-0", T), ("-7", "-7", T), ("-7", "7", F), ("3/4", "0.75", T), ("0.75", r"\frac{3}{4}", T),
    (r"\frac{3}{4}", "0.7500", T), (r"\frac{3}{4}", "0.74", F), (r"\frac{1}{3}", "0.333", F),
    (r"\frac{1}{3}", "0.3333333333", F), (r"\frac{1}{3}", r"\frac{2}{6}", T), (r"\frac{2}{3}", r"\frac{3}{2}", F),
    ("0.5", r"\frac12", T), ("0.5", ".5", T), ("12.50", "12.5", T), ("1.5", "1.05", F),
    (r"-\frac{1}{2}", r"\frac{-1}{2}", T), (r"-\frac{1}{2}", r"\frac{1}{-2}", T), (r"-\frac{1}{2}", r"\frac{1}{2}", F),
    ("100", "10^2", T), ("1024", "2^{10}", T), ("1024", "2^{11}", F), ("1000000", r"10^6", T),
    ("1500", r"1.5 \times 10^3", T), ("1500", r"1.5 \times 10^4", F), ("120", "5!", T), ("10", r"\binom{5}{2}", T),
    ("12345678901234567890123", "12345678901234567890123", T),
    ("12345678901234567890123", "12345678901234567890124", F),
    (r"10^{100}", r"10^{100}+1", F), (r"10^{100}", "1" + "0" * 100, T), (r"10^{-20}", "0", F),
    ("0", r"10^{-30}", F), (r"2^{-3}", r"\frac{1}{8}", T), ("0.125", r"2^{-3}", T), ("7", "7.", T),
    (r"\frac{7}{2}", r"3\frac{1}{2}", T), (r"\frac{7}{2}", r"3\frac{1}{3}", F), ("3.5", r"\frac{7}{2}", T),
    ("2", r"\frac{4}{2}", T), ("2", r"\frac{6}{2}", F), ("-3", r"-\frac{9}{3}", T), ("1", r"0.\overline{9}", T),
    (r"\frac{1}{3}", r"0.\overline{3}", T), (r"\frac{1}{3}", r"0.\overline{33}", T), (r"\frac{7}{9}", r"0.\overline{7}", T),
    (r"\frac{1}{6}", r"0.1\overline{6}", T), (r"\frac{1}{6}", r"0.\overline{16}", F), ("0.001", r"10^{-3}", T),
    ("0.001", r"10^{-4}", F), ("6", "2*3", T), ("60", "12 5", F), ("6", "2 3", F), ("6", r"2\cdot 3", T), ("6", r"2 \times 3", T), ("2", r"6 \div 3", T),
]

NORMALISATION = [
    (r"\frac{1}{2}", r"\dfrac{1}{2}", T), (r"\frac{1}{2}", r"\tfrac{1}{2}", T), (r"\frac{1}{2}", r"\dfrac12", T),
    (r"\frac{1}{2}", r"\dfrac{1}{3}", F), ("(1,2)", r"\left(1,2\right)", T), ("(1,2)", r"\left[1,2\right]", F),
    ("5", r"\, 5 \;", T), ("5", r"\displaystyle 5", T), ("5", r"\text{5}", T), ("5", r"\mathbf{5}", T),
    ("5", r"\mathrm{5}", T), ("5", r"\textbf{6}", F), ("1000", "1,000", T), ("1000", r"1\,000", T),
    ("1000", "1{,}000", T), ("1000", "1 000", T), ("1000000", "1,000,000", T), ("1000", "1,001", F),
    ("1000", "100", F), ("1234567", r"1{,}234{,}567", T), ("3000.5", "3,000.5", T),
    ("-0.5", "\u2212\u00bd", T), ("0.5", "\u00bd", T), ("0.25", "\u00bc", T), (r"\sqrt{2}", "\u221a2", T),
    (r"\pi", "\u03c0", T), (r"2\pi", "2\u03c0", T), (r"\infty", "\u221e", T), ("-3", "\u22123", T),
    (r"\sqrt{3}", "\u221a2", F), ("5", r"5 \text{ cm}", T), ("5", r"5\text{ cm}^2", T), ("5", r"5 \mbox{ meters}", T),
    ("5", "5 cm", T), ("5", "5 apples", T), ("6", "5 apples", F), ("12", r"\$12", T), ("12", r"12 \text{ dollars}", T),
    ("12.50", r"\$12.50", T), ("12.50", r"\$12.05", F), ("30", r"30^\circ", T), ("30", r"30^{\circ}", T),
    ("30", "30\u00b0", T), ("30", r"30 \text{ degrees}", T), ("31", r"30^\circ", F), (r"30^\circ", "30", T),
    ("50", r"50\%", T), (r"50\%", "50", T), (r"50\%", r"50 \%", T), (r"50\%", "51", F), ("25", r"25 \text{ percent}", T),
    ("4", r"4 \text{ units}^2", T), ("5", r"5 \text{ m}", T), ("5", r"5\,\mathrm{m}^2", T), ("5", "5 m/s", T),
    ("2m", "2", F), ("2m+1", "2m + 1", T), ("5m^2", "5", F), ("3s", "3", F), ("3", r"3\text{ s}", T), ("3", r"3 \text{ hours}", T), ("3", r"3 \text{ hours and } 4", F),
    (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}2", T), (r"\sqrt{3}", r"\sqrt3", T), (r"\sqrt{3}", r"\sqrt{3.0}", T),
    ("x^2", "x^{2}", T), ("x^2", "x ^ 2", T), (r"\frac{x}{2}", "x/2", T), (r"\frac{x}{2}", "2/x", F),
    (r"\text{Monday}", "Monday", T), (r"\text{Monday}", r"\text{monday}", T), (r"\text{Monday}", "Tuesday", F),
    ("A", "(A)", T), (r"\text{(B)}", "B", T), ("(C)", r"\textbf{(C)}", T), ("(C)", "(D)", F), ("A", "B", F),
    ("even", r"\text{even}", T), ("even", "odd", F), ("5", "five", T), ("5", r"\text{five}", T), ("5", "six", F),
    ("C", r"\text{(C) } 12", T), ("C", r"(D) 12", F), ("yes", r"\text{Yes}", T), ("no", "yes", F),
]

SYMBOLIC = [
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", T), (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt{2}}{2}", F),
    (r"2\sqrt{2}", r"\sqrt{8}", T), (r"2\sqrt{2}", r"\sqrt{6}", F), (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", T),
    (r"\pi", "3.14", F), (r"\pi", "3.14159", F), ("3.14", r"\pi", F), (r"\pi", r"\pi", T), (r"2\pi", r"\pi \cdot 2", T),
    (r"\frac{\pi}{4}", r"\frac{1}{4}\pi", T), (r"\frac{\pi}{4}", r"\frac{\pi}{3}", F), (r"\sqrt[3]{8}", "2", T),
    (r"\sqrt[3]{2}", r"2^{1/3}", T), (r"\sqrt[3]{2}", r"2^{1/2}", F), ("e", r"\exp(1)", T), ("e^2", r"\exp(2)", T),
    (r"\ln 2", r"\log 2", T), (r"\log_2 8", "3", T), (r"\log_2 8", "4", F), (r"\sin(\pi/6)", r"\frac12", T),
    (r"\cos 0", "1", T), (r"\tan(\pi/4)", "1", T), (r"\frac{1+\sqrt{5}}{2}", r"\frac{\sqrt{5}+1}{2}", T),
    (r"\frac{1+\sqrt{5}}{2}", r"\frac{\sqrt{5}-1}{2}", F), (r"3 - 2\sqrt{2}", r"(\sqrt{2}-1)^2", T),
    (r"3 + 2\sqrt{2}", r"(\sqrt{2}-1)^2", F), ("x^2+2x+1", "(x+1)^2", T), ("x^2+2x+1", "(x-1)^2", F),
    ("x^2-1", "(x-1)(x+1)", T), ("x^2-1", "(x-1)(x-1)", F), ("2x+3", "3+2x", T), ("2x+3", "3x+2", F),
    (r"\frac{x+1}{x}", r"1+\frac{1}{x}", T), (r"\frac{x+1}{x}", r"1+x", F), ("a^2 b", "b a^2", T), ("ab", "ba", T),
    (r"\sin^2 x + \cos^2 x", "1", T), (r"2\sin x \cos x", r"\sin 2x", T), (r"2\sin x\cos x", r"\sin x", F),
    ("|x|", r"\sqrt{x^2}", T), ("x", r"\sqrt{x^2}", F), ("|-3|", "3", T), (r"\left| -3 \right|", "3", T),
    (r"\frac{a}{b}", r"a b^{-1}", T), ("6x^2y", "6yx^2", T), ("6x^2y", "6xy^2", F), (r"\alpha + \beta", r"\beta+\alpha", T),
    (r"\sqrt{2}+\sqrt{3}", r"\sqrt{3}+\sqrt{2}", T), (r"\sqrt{2}+\sqrt{3}", r"\sqrt{5}", F),
    (r"10^{100}+\sqrt{2}", r"10^{100}+\sqrt{2}+1", F), (r"\lfloor 3.7 \rfloor", "3", T), (r"\lceil 3.2 \rceil", "4", T),
    ("x_1 + x_2", "x_2 + x_1", T), ("x_1 + x_2", "x_1 + x_3", F), (r"\frac{d}{2}", r"0.5d", T),
]

COMPLEX = [
    ("3+4i", "4i+3", T), ("3+4i", "3-4i", F), ("2i", r"\sqrt{-4}", T), ("i", r"\sqrt{-1}", T), ("-1", "i^2", T), ("1", "i^2", F),
    ("1+i", r"\frac{2}{1-i}", T), ("1-i", r"\frac{2}{1-i}", F), ("5", "(2+i)(2-i)", T), ("2+i", "(2+i)", T),
    (r"\frac{1}{2}+\frac{\sqrt{3}}{2}i", r"\frac{1+i\sqrt{3}}{2}", T), ("-i", r"\frac{1}{i}", T), ("i", r"\frac{1}{i}", F),
]

STRUCTURES = [
    ("1, 2, 3", "3, 2, 1", T), ("1, 2, 3", "1, 2", F), ("1, 2, 3", "1, 2, 3, 4", F), (r"\{1, 2\}", r"\{2, 1\}", T),
    (r"\{1,2\}", "2, 1", T), (r"\{1, 2\}", r"\{1, 3\}", F), ("1,2", r"x = 1 \text{ or } x = 2", T),
    ("1,2", "x=1, x=2", T), ("1,2", r"x=1 \text{ and } x = 3", F), ("(1, 2)", "(1, 2)", T), ("(1, 2)", "(2, 1)", F),
    ("(1, 2)", r"\left( 1, 2 \right)", T), ("(1,2,3)", "(1,2,3)", T), ("(1,2,3)", "(1,3,2)", F), ("(1,2)", "1, 2", T),
    ("(3, -1)", r"(3,-1)", T), (r"\left(\frac{1}{2}, -3\right)", "(0.5, -3)", T), ("(0.5, -3)", "(0.5, 3)", F),
    (r"\langle 1, 2 \rangle", "(1,2)", T), (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
                                            r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}", T),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}", F),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{pmatrix} 1 & 2 & 3 & 4 \end{pmatrix}", F),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", "(1, 2)", T), (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", "(2, 1)", F),
    (r"\begin{pmatrix} \frac12 \\ -1 \end{pmatrix}", r"\begin{pmatrix} 0.5 \\ -1 \end{pmatrix}", T),
    (r"1 \pm \sqrt{2}", r"1+\sqrt{2}, 1-\sqrt{2}", T), (r"1 \pm \sqrt{2}", r"1-\sqrt{2}, 1+\sqrt{2}", T),
    (r"1 \pm \sqrt{2}", r"1+\sqrt{2}", F), (r"\pm 3", "3, -3", T), (r"\pm 3", "3", F), ("3, -3", r"\pm 3", T),
    (r"\frac{-1 \pm \sqrt{5}}{2}", r"\frac{-1+\sqrt5}{2}, \frac{-1-\sqrt5}{2}", T), (r"\emptyset", r"\varnothing", T),
    (r"\emptyset", r"\{\}", T), (r"\emptyset", "0", F), ("1, 1, 2", "1, 2, 1", T), (r"\{3\}", "3", T),
]

INTERVALS = [
    ("(1, 2]", "(1, 2]", T), ("(1, 2]", "[1, 2]", F), ("(1, 2]", "(1, 2)", F), ("[1, 2)", "(1, 2)", F),
    (r"(-\infty, 3)", r"(-\infty, 3)", T), (r"(-\infty, 3)", r"(-\infty, 3]", F), (r"(-\infty, 3)", "x < 3", T),
    (r"(-\infty, 3]", r"x \le 3", T), (r"(-\infty, 3]", "x < 3", F), (r"[2, \infty)", r"x \geq 2", T),
    (r"[2, \infty)", r"2 \le x", T), (r"[2, \infty)", "x > 2", F), (r"(-1, 2]", r"-1 < x \le 2", T),
    (r"(-1, 2]", r"-1 \le x \le 2", F), ("x < 3", r"(-\infty, 3)", T), (r"-1 < x \le 2", "(-1, 2]", T),
    (r"-1 < x \le 2", "[-1, 2]", F), (r"x \ge 5", r"[5, \infty)", T), (r"x \ge 5", r"(5, \infty)", F),
    (r"(-\infty, 1) \cup (2, \infty)", r"(-\infty, 1) \cup (2, \infty)", T),
    (r"(-\infty, 1) \cup (2, \infty)", r"(2, \infty) \cup (-\infty, 1)", T),
    (r"(-\infty, 1) \cup (2, \infty)", r"(-\infty, 1] \cup (2, \infty)", F),
    (r"(-\infty, 1) \cup (2, \infty)", r"x < 1 \text{ or } x > 2", T),
    (r"(-\infty, 1) \cup (2, \infty)", r"x < 1 \text{ or } x > 3", F), (r"x \neq 2", r"(-\infty, 2) \cup (2, \infty)", T),
    (r"(-\infty, \infty)", r"\mathbb{R}", T), (r"\mathbb{R}", r"(-\infty, \infty)", T), (r"[0, 1]", r"x \in [0, 1]", T),
    (r"[0, 1]", r"x \in (0, 1]", F), (r"\left[ \frac{1}{2}, 3 \right)", r"[0.5, 3)", T), (r"[\frac12, 3)", "[0.5, 3]", F),
    (r"(2, 5)", r"5 > x > 2", T), (r"(2, 5)", r"5 \ge x > 2", F), (r"(-\infty, -\frac{3}{2})", r"x<-1.5", T),
]

EQUATIONS = [
    ("5", "x = 5", T), ("x = 5", "5", T), ("x=5", "x=5", T), ("5", "x = 6", F), ("x = 5", "y = 5", T),
    ("y = 2x + 3", "y=3+2x", T), ("y = 2x + 3", "2x - y + 3 = 0", T), ("y = 2x + 3", "2x - y - 3 = 0", F),
    ("y = 2x+3", "4x - 2y + 6 = 0", T), ("2x + 3y = 6", "y = 2 - \\frac{2}{3}x", T), ("2x + 3y = 6", "3x + 2y = 6", F),
    ("x^2 + y^2 = 4", "x^2 + y^2 - 4 = 0", T), ("x^2 + y^2 = 4", "x^2 + y^2 = 2", F), ("k = 3", "3", T),
    (r"x = \frac{1}{2}", "0.5", T), ("x=2", "2=x", T), ("x_1 = 4", "4", T), ("(1,2)", "x=1, y=2", T),
    ("(1,2)", "x=2, y=1", F), ("(x,y) = (1,2)", "(1,2)", T), ("f(x) = x^2", "x^2", T), ("x^2+1", "f(x) = x^2 + 1", T),
    ("x^2+1", "f(x) = x^2 - 1", F), ("5", "x = 2 + 3 = 5", T), (r"\pi", r"\pi \approx 3.14", T),
    ("3.14", r"x \approx 3.14", T), (r"\pi", r"x \approx 3.14", F), ("2x", "f(x) = 2x", T),
    (r"x \le 3", r"x \le 3", T), (r"x \le 3", "x < 3", F), ("x > 2", "2 < x", T),
]

HEDGING = [
    ("3", r"3 \text{ or } 4", F), ("3", "3, 4", F), ("3", r"3 \text{ and } 4", F), ("3", "3 or 4", F),
    ("3", r"x = 3 \text{ or } x = 4", F), ("3, 4", r"3 \text{ or } 4", T), ("3", r"3 \text{ or } 3", T),
    (r"\frac{1}{2}", r"\frac{1}{2}, \frac{1}{3}", F), ("(1, 2)", "(1, 2), (2, 1)", F), ("2", r"\pm 2", F),
]

# whole completions: extraction rules
EXTRACT = [
    ("19", r"Adding up, we get $\boxed{19}$.", T),
    ("19", r"First I thought \boxed{18} but that is wrong. The answer is $\boxed{19}$.", T),
    ("19", r"The answer is $\boxed{19}$. Wait, let me recheck: actually \boxed{18}.", F),
    ("3", r"So $x = \fbox{3}$.", T),
    ("1, 2", r"The solutions are $\boxed{1}$ and $\boxed{2}$.", T),
    ("1, 2", r"The solutions are $\boxed{1}$, $\boxed{2}$.", T),
    ("2", r"The solutions are $\boxed{1}$ and $\boxed{2}$.", F),
    ("2", r"We compute $\boxed{2}$ for the first part. Then many more steps follow here, and at the end $\boxed{2}$", T),
    (r"\frac{1}{2}", r"Thus the probability is $\boxed{\frac{1}{2}}$.", T),
    (r"\frac{1}{2}", r"Thus the probability is $\boxed{\dfrac{1}{2}}$", T),
    ("72", "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips altogether.\n#### 72", T),
    ("72", "She sold 48+24 = 72 clips altogether.\n#### 70", F),
    ("42", "Let me think. The final answer is 42.", T),
    ("42", "Let me think. The final answer is $42$.", T),
    ("42", "The answer is: 42", T),
    ("42", "Answer: 42", T),
    ("42", "After all that work, the answer is 41.", F),
    ("7", "So 3 + 4 = 7.", T),
    ("7", "3 + 4 = 8.", F),
    ("7", "7", T),
    ("7", r"$\frac{14}{2}$", T),
    ("5", "<think>The answer is 4. No wait, maybe \\boxed{4}.</think>The answer is \\boxed{5}.", T),
    ("4", "<think>The answer is 4. No wait, maybe \\boxed{4}.</think>The answer is \\boxed{5}.", F),
    ("4", "<think>Let me compute. The answer is \\boxed{4}. Hmm, but then I need", U),
    ("4", "We get \\boxed{4}. Then let us double check the other case with \\boxed{5", U),
    ("12", "Let's compute step by step. First 3 + 4 = 7, then multiply this by", U),
    ("12", "Let's compute step by step. The answer is", U),
    ("12", "", U),
    ("12", r"The final answer is $\boxed{12}$ apples.", T),
    ("12", r"Therefore, the total cost is $\boxed{\$12}$.", T),
    (r"\frac{3}{4}", r"The value is $\boxed{\frac{3}{4}}$. I hope it is correct.", T),
    ("x^2+1", r"Final Answer: The final answer is $x^2+1$. I hope it is correct.", T),
    ("x^2+1", r"Final Answer: The final answer is $x^2-1$. I hope it is correct.", F),
    ("(1,2)", r"The point is \boxed{(1,2)}.", T),
    ("10", r"so the result is \boxed{ 10 }", T),
    ("10", r"\boxed 10", T),
    ("8", r"The answer is \boxed{\boxed{8}}", T),
    (r"\frac{1}{2}", r"Since $\frac{a}{b} = \frac{1}{2}$ we have $\boxed{\frac{1}{2}}$", T),
    ("5", "x equals 5.", T),
    (r"\frac{1}{2}", r"The answer is \frac{1}{2.", F),  # malformed, even if its text matches
    ("7", "Adding the two parts:\n3 + 4 = 7", T),
    ("7", "Adding the two parts:\n3 + 4 = 8", F),
    (r"(-\infty, \infty)", r"The solution set is $\boxed{\text{all real numbers}}$.", T),
    (r"(0, \infty)", r"The solution set is $\boxed{\text{all real numbers}}$.", F),
    ("5", "\\boxed{" * 30000, U),  # 210k characters of unclosed boxes
    ("5", "{" * 200000, U),
    ("5", "the answer is " * 15000, U),
    ("5", "\\boxed{1} " * 20000, F),
    ("5", "<think>" + "x" * 200000, U),
    ("5", "The answer is **5**.", T),
    ("5", "The answer is **6**.", F),
    ("12", "So there are 12 students in total.", T),
    ("12", "So there are 13 students in total.", F),
    ("5", "The answer is $x = 5$, since the other root is negative.", T),
    ("5", "The answer is 5 because the other root is negative.", T),
    ("5", "The answer is 4 because the other root is negative.", F),
    ("5", "**Final Answer**\n\n\\[\n\\boxed{5}\n\\]", T),
    # found with Math-Verify's own test rows
    ("9", "Answer $ \n 9 \n $", U), ("9", "Answer \\( \n 9 \n \\)", U), ("9", "Answer \\[ \n 9 \n \\]", T),  # inline math is one line
    (r"\frac{10}{9}", r"Answer $ \frac{1}{2} \$ = \frac{10}{9} $", T), (r"\frac{10}{9}", r"Answer $ \frac{1}{2} \$ = \frac{10}{7} $", F),
    ("12", "Therefore, there are 12 distinct sequences. I hope it is correct. <|im_start|>user", T),
    ("12", "Therefore, there are 13 distinct sequences. I hope it is correct.", F),
    ("12, 13", 'Final Answer: The final answer is \\"$12 $ and $13 $\\". I hope it is correct.', T),
    ("12, 13", 'Final Answer: The final answer is \\"$12 $ and $14 $\\". I hope it is correct.', F),
    ("100", r"so $$\frac{a}{b} \geq \frac{2}{1}.$$ Therefore, the error increases by 100%.", T),
    ("(3,3),(1,1)", r"$$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}$$", T),
    ("(3,3)", r"$$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}$$", F),
    ("1, 2", r"So \boxed{1}. Wait, no: \boxed{2}", F),
    (r"y_{1}=-2 x^{2}+4 x+3, y_{2}=3 x^{2}+12 x+10", r"\( y_1 = \boxed{-2(x - 1)^2 + 5} \) and \( y_2 = \boxed{3(x + 2)^2 - 2} \)", T),
    (r"y_{1}=-2 x^{2}+4 x+3, y_{2}=3 x^{2}+12 x+10", r"\( y_1 = \boxed{-2(x - 1)^2 + 5} \) and \( y_2 = \boxed{3(x + 2)^2 + 2} \)", F),
    (r"x_{1}=\frac{1}{2},\quadx_{2}=3", r"$\boxed{\dfrac{1}{2}} \quad \text{and} \quad \boxed{3}$", T),
    (r"x_{1}=\frac{1}{2},\quadx_{2}=3", r"$\boxed{\dfrac{1}{2}} \quad \text{and} \quad \boxed{4}$", F),
    (r"\boxed{1} papers and \boxed{2} bins", r"$\boxed{1,2}$", T),  # a reference solution: all its boxes
    (r"\boxed{1} no no no no no \boxed{2}", r"$\boxed{1,2}$", F),
    (r"\boxed{W(n) = 1 \text{ and } W(n) = -1", "W(x)=1orW(x)=-1", T),  # an unclosed box in a reference runs to the end
    (r"\boxed{W(n) = 1 \text{ and } W(n) = -1", "W(x)=1orW(x)=2", F),
    (r"\frac{1}{2}", "The answer is $\x0crac{1}{2}$.", T), (r"\frac{1}{2}", "The answer is $\x0crac{1}{3}$.", F),  # "\frac" lost its backslash
]

# whole completions in the styles models write (formats, units, choices, trailing remarks)
COMPLETIONS = [
    ("(-\\infty,-2]\\cup[2,\\infty)", "\\boxed{x \\le -2 \\text{ or } x \\ge 2}", T),
    ("\\frac{1}{2}", "\\boxed{1/2}", T), ("\\frac{2}{3}", "\\boxed{2/3}", T), ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/2}", T),
    ("\\frac{x}{2}", "\\boxed{\\frac{1}{2}x}", T), ("18.90", "\\boxed{\\$18.90}", T), ("18.90", "\\boxed{18.9}", T),
    ("0", "\\boxed{\\sin \\pi}", T), ("\\frac{5}{12}", "\\boxed{5/12}", T), ("-\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{-\\sqrt{3}}{2}}", T),
    ("\\frac{3}{2}", "\\boxed{1\\frac{1}{2}}", T), ("\\{3,5,7\\}", "\\boxed{3,5,7}", T), ("x^2", "\\boxed{x\\cdot x}", T),
    ("6.02 \\times 10^{23}", "\\boxed{6.02\\times10^{23}}", T), ("6.02 \\times 10^{23}", "\\boxed{6.02\\times10^{22}}", F),
    ("\\text{No solution}", "\\boxed{\\text{no solution}}", T), ("1000", "The answer is $1,000$.", T),
    ("2", "Final answer: $\\boxed{2}$", T), ("2", "The final answer is: $\\boxed{2}$", T),
    ("3", "The answer is \\( 3 \\).", T), ("3", "The answer is \\[ 3 \\]", T), ("-2", "so $x=-2$.", T),
    ("\\frac{1}{4}", "the probability is $\\frac14$.", T), ("2", "Thus the answer is 2.\n\nI hope this helps!", T),
    ("4", "Therefore $\\boxed{4}$ is the answer.\nLet me double-check: $2+2=4$. Yes.", T),
    ("10", "The area is 10 square units.", T), ("10", "The area is $10$ square units.", T),
    ("(2,3)", "The point is $(2, 3)$.", T), ("\\frac{\\pi}{3}", "\\boxed{60^\\circ}", F),
    ("90", "\\boxed{90^{\\circ}}", T), ("\\sqrt{2}", "\\boxed{2^{1/2}}", T), ("\\sqrt{2}", "\\boxed{2^{0.5}}", T),
    ("e", "\\boxed{e}", T), ("e^{-1}", "\\boxed{1/e}", T), ("\\ln(2)", "\\boxed{\\ln 2}", T), ("\\log_{3} 9", "\\boxed{2}", T),
    ("3x+2", "\\boxed{3x + 2}", T), ("3x+2", "\\boxed{2 + 3 x}", T), ("\\frac{1}{x+1}", "\\boxed{(x+1)^{-1}}", T),
    ("a+b", "\\boxed{b+a}", T), ("n(n+1)/2", "\\boxed{\\frac{n^2+n}{2}}", T), ("n(n+1)/2", "\\boxed{\\frac{n^2-n}{2}}", F),
    ("\\dfrac{1}{2}", "\\boxed{\\frac{1}{2}}", T), ("x \\in [2,5]", "\\boxed{[2,5]}", T), ("[2,5]", "\\boxed{2 \\le x \\le 5}", T),
    ("1, -1", "\\boxed{\\pm 1}", T), ("(1,-1)", "\\boxed{\\pm 1}", F), ("\\$5", "\\boxed{5}", T), ("5\\text{ cm}", "\\boxed{5}", T),
    ("5\\text{ cm}^2", "\\boxed{5 \\mathrm{cm^2}}", T), ("12\\text{ inches}", "\\boxed{12}", T), ("\\text{(A)}", "\\boxed{A}", T),
    ("A", "\\boxed{\\textbf{(A)}}", T), ("B", "The answer is (B).", T), ("B", "The correct option is B.", T),
    ("1/3", "\\boxed{0.\\overline{3}}", T), ("\\frac{1}{3}", "\\boxed{.\\overline{3}}", T), ("11", "\\boxed{11}.", T),
    ("7", "\\boxed{7} \\text{ apples}", T), ("7", "$$\\boxed{7}$$", T), ("\\frac{7}{2}", "\\boxed{3.5}", T),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}", T), ("x=2", "\\boxed{2}", T), ("x=2, y=3", "\\boxed{(2,3)}", T),
    ("0.5", "\\boxed{50\\%}", F), ("1,2,3", "\\boxed{1,2,3}", T), ("1,2,3", "\\boxed{\\{1,2,3\\}}", T),
    ("\\infty", "\\boxed{\\infty}", T), ("-\\infty", "\\boxed{-\\infty}", T), ("\\infty", "\\boxed{-\\infty}", F),
    ("\\begin{pmatrix}1\\\\2\\\\3\\end{pmatrix}", "\\boxed{\\begin{pmatrix}1\\\\2\\\\3\\end{pmatrix}}", T),
    ("\\begin{pmatrix}1 & 0\\\\0 & 1\\end{pmatrix}", "\\boxed{\\left[\\begin{matrix}1 & 0\\\\0 & 1\\end{matrix}\\right]}", T),
    ("4", "\\boxed{\\sqrt{16}}", T), ("4", "\\boxed{-4}", F), ("\\pm 4", "\\boxed{4, -4}", T), ("\\frac{1}{2}", "\\boxed{\\frac{1}{2} \\text{ hours}}", T),
    ("2", "\\boxed{2\\,\\text{m/s}}", T), ("15", "\\boxed{15\\text{ m}^2}", T), ("3", "\\boxed{3 \\text{ km/h}}", T),
    ("y=-x+2", "\\boxed{y=2-x}", T), ("y=-x+2", "\\boxed{x+y=2}", T), ("y=-x+2", "\\boxed{x+y=3}", F),
    ("\\frac{9}{4}", "\\boxed{2.25}", T), ("2.25", "\\boxed{\\frac94}", T), ("9", "\\boxed{9.00}", T),
    ("1.5", "\\boxed{\\frac{3}{2}}", T), ("20\\%", "\\boxed{20\\%}", T), ("20", "\\boxed{0.2}", F),
    ("\\sqrt{5}", "\\boxed{\\sqrt 5}", T), ("5\\sqrt{5}", "\\boxed{5 \\sqrt{5}}", T), ("5\\sqrt{5}", "\\boxed{\\sqrt{125}}", T),
    ("\\frac{1}{2}", "The answer is 1/2.", T), ("\\frac{1}{2}", "The answer is 0.5.", T), ("1", "The answer is 1.", T),
    ("2", "The answer is 2, i.e. two apples.", T), ("3", "So the answer is 3 (three).", T),
    ("\\text{Devon}", "\\boxed{\\text{Devon}}", T), ("\\text{Devon}", "\\boxed{Devon}", T), ("8", "\\boxed{2^3}", T),
    ("256", "\\boxed{2^8}", T), ("\\frac{3}{8}", "\\boxed{\\dfrac{3}{8}}", T), ("10", "\\boxed{10.}", T),
    ("-1", "\\boxed{-1}", T), ("-1", "\\boxed{- 1}", T), ("-1", "\\boxed{−1}", T), ("p^2q", "\\boxed{qp^2}", T),
    ("\\sqrt[4]{3}", "\\boxed{3^{1/4}}", T), ("\\cos^2\\theta", "\\boxed{1-\\sin^2\\theta}", T),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}\\boxed{\\frac{1}{2}}", T), ("12", "#### 12", T), ("12", "####12", T),
    ("2", "The answer is $\\boxed{2}$.\n\nThe answer is 3.", F),  # the later statement is the final word
    ("10455", "so she has $10,200 + \\boxed{255}$ now. Final Answer: The final answer is $10,455$. I hope it is correct.", T),
    ("19", "Final Answer: The maximum number of points that could be in the domain of $f(x)$ is 19. <|im_start|>user", T),
    ("2", "AZYUK2A", U), ("14916", "Therefore, $\\boxed{14 {, }916}$ is our answer.", T),
    ("4, 5", "$AB=4, CD=5$", T), ("1000.99", "the number is not 10 which is 1,000.99\u20ac", T),
    ("1000.99", "The total comes to 1,000.99€.", T), ("1000.99", "The total comes to 1,000.99 €.", T), ("25", "So the area is $25$ m².", T),
    ("28\\%", "The answer is 28 pct.", T), ("28\\%", "The answer is $28$ percent.", T), ("28", "\\boxed{28}\\%", T),
    ("15\\mbox{ cm}^2", "area $=\\boxed{15\\mbox{ cm}^2}$", T), ("15\\mbox{ cm}^2", "\\boxed{15}", T), ("15\\mbox{ cm}^2", "\\boxed{16\\text{ cm}^2}", F),
    ("204_5", "\\boxed{204_5}", T), ("204_5", "\\boxed{204_{5}}", T), ("204_5", "\\boxed{203_5}", F),
    ("12\\text{ and }13", "between $\\boxed{12\\text{ and }13}$", T), ("-2,1", "roots are $\\boxed{-2,1}.$", T), ("-2,1", "$\\boxed{1, -2}$", T),
    ("9", "we have $\\equiv \\boxed{9} \\pmod{11}$.", T), ("(3, \\frac{\\pi}{2})", "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$", T),
    ("(3, \\frac{\\pi}{2})", "$\\boxed{\\left( 3, \\frac{\\pi}{3} \\right)}.$", F), ("\\frac{14}{3}", "$=2+\\frac{5}{3}+1=\\boxed{\\frac{14}{3}}$", T),
    ("1", "\\boxed{\\frac3{3}}", T), ("\\frac13", "\\boxed{\\cfrac{1}{3}}", T), ("10", "Answer \\( (9+1) \\)", T),
    ("9", "Answer $$ \n 9 \n $$", T), ("\\frac13", "$k = \\frac{1}{3}$", T),
    ("\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}", "\\boxed{\n\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}\n}.", T),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}}", T),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}}", F),
    ("3\\sqrt{13}", "$\\sqrt{117} = \\boxed{3\\sqrt{13}}$", T), ("x \\in (-\\infty, 0)", "\\boxed{(-\\infty,0)}", T),
    ("\\{-1, 3\\}", "\\boxed{x=-1, x=3}", T), ("y^2 = 4x", "\\boxed{y^2 - 4x = 0}", T), ("y^2=4x", "\\boxed{y^2 = 4 x + 1}", F),
    ("2\\pi", "\\boxed{2 \\pi \\text{ radians}}", T), ("\\$32,000", "\\boxed{32000}", T), ("\\$32,000", "\\boxed{\\$32{,}000}", T),
    ("0.6", "\\boxed{60\\%}", F), ("\\frac{3}{5}", "\\boxed{0.6}", T), ("6\\sqrt{6}", "\\boxed{6 \\sqrt{6} \\text{ units}}", T),
    ("\\sqrt{2}", "\\boxed{1.414}", F), ("8", "\\boxed{8.0000}", T), ("2005", "\\boxed{2,005}", T), ("2005", "\\boxed{2.005}", F),
    ("3", "The final answer is $\\boxed{3}$. Hmm wait, let's make sure. Yes, it's 3.", T),
    ("-\\frac{1}{2}", "\\boxed{-0.5}", T), ("\\frac{-1}{2}", "\\boxed{-\\tfrac12}", T), ("\\tfrac{1}{2}", "\\boxed{\\frac{1}{2}}", T),
    ("1", "\\boxed{1}\\quad\\text{(units)}", T), ("a=2", "\\boxed{a = 2}", T), ("x^2+y^2=25", "\\boxed{x^2+y^2=25}", T),
    ("\\left(-\\frac{1}{2}, \\frac{3}{2}\\right)", "\\boxed{(-0.5, 1.5)}", T), ("(-\\frac{1}{2}, \\frac{3}{2})", "\\boxed{[-0.5, 1.5]}", F),
    ("\\frac{\\sqrt{6}}{4}", "\\boxed{\\frac{\\sqrt{3}}{2\\sqrt{2}}}", T), ("5", "\\boxed{\\text{5 dollars}}", T),
    ("\\text{Sunday}", "\\boxed{\\text{Sunday}}", T), ("\\text{Sunday}", "The answer is Sunday.", T), ("\\text{Sunday}", "The answer is Monday.", F),
    ("13", "$13$", T), ("\\infty", "\\boxed{+\\infty}", T), ("1", "\\boxed{1^{\\circ}}", T),
    ("2", "We have $x = 2$.\n\nTherefore, the answer is $\\boxed{2}$.\n\nFinal Answer: 2", T),
    ("\\frac{1}{2}", "answer: $\\frac{1}{2}$", T), ("4", "**Answer:** 4", T), ("4", "**Answer: 4**", T), ("4", "Answer: **4**", T),
    # near misses in the same styles
    ("\\frac{1}{2}", "\\boxed{1/3}", F), ("\\frac{2}{3}", "\\boxed{3/2}", F), ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/3}", F),
    ("\\frac{x}{2}", "\\boxed{\\frac{1}{2}y}", F), ("18.90", "\\boxed{\\$18.09}", F), ("0", "\\boxed{\\cos \\pi}", F),
    ("\\frac{5}{12}", "\\boxed{12/5}", F), ("-\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{3}}{2}}", F),
    ("\\frac{3}{2}", "\\boxed{1\\frac{1}{3}}", F), ("\\{3,5,7\\}", "\\boxed{3,5}", F), ("x^2", "\\boxed{x\\cdot 2}", F),
    ("1000", "The answer is $1,000.5$.", F), ("-2", "so $x=2$.", F), ("\\frac{1}{4}", "the probability is $\\frac15$.", F),
    ("10", "The area is 12 square units.", F), ("(2,3)", "The point is $(3, 2)$.", F), ("90", "\\boxed{89^{\\circ}}", F),
    ("\\sqrt{2}", "\\boxed{2^{1/3}}", F), ("e^{-1}", "\\boxed{-e}", F), ("\\log_{3} 9", "\\boxed{3}", F),
    ("a+b", "\\boxed{a-b}", F), ("x \\in [2,5]", "\\boxed{[2,5)}", F), ("1, -1", "\\boxed{\\pm 2}", F),
    ("5\\text{ cm}^2", "\\boxed{25 \\mathrm{cm^2}}", F), ("A", "\\boxed{\\textbf{(B)}}", F), ("B", "The answer is (C).", F),
    ("\\frac{1}{3}", "\\boxed{.\\overline{31}}", F), ("7", "\\boxed{17} \\text{ apples}", F), ("2\\sqrt{3}", "\\boxed{\\sqrt{6}}", F),
    ("x=2, y=3", "\\boxed{(3,2)}", F), ("1,2,3", "\\boxed{\\{1,2\\}}", F), ("\\infty", "\\boxed{\\infty + 1}", T),
    ("\\begin{pmatrix}1\\\\2\\\\3\\end{pmatrix}", "\\boxed{\\begin{pmatrix}1\\\\2\\\\4\\end{pmatrix}}", F),
    ("\\frac{9}{4}", "\\boxed{2.24}", F), ("9", "\\boxed{9.01}", F), ("\\sqrt{5}", "\\boxed{\\sqrt 6}", F),
    ("\\text{Devon}", "\\boxed{\\text{Devin}}", F), ("256", "\\boxed{2^7}", F), ("-1", "\\boxed{1}", F),
    ("p^2q", "\\boxed{pq^2}", F), ("\\cos^2\\theta", "\\boxed{1-\\cos^2\\theta}", F), ("12", "#### 21", F),
    ("(3, \\frac{\\pi}{2})", "$\\boxed{\\left( \\frac{\\pi}{2}, 3 \\right)}.$", F), ("-2,1", "$\\boxed{2,-1}$", F),
    ("204_5", "\\boxed{204}", F), ("\\$32,000", "\\boxed{32{,}001}", F), ("6\\sqrt{6}", "\\boxed{6 \\sqrt{5} \\text{ units}}", F),
    ("\\text{Sunday}", "\\boxed{\\text{Saturday}}", F), ("x^2+y^2=25", "\\boxed{x^2+y^2=5}", F), ("a=2", "\\boxed{a = -2}", F),
]

# number formats across locales: thousands grouped by , . space ' and decimal commas. A lone "1,5"
# is ambiguous (1.5 or the list 1, 5): the other side picks the reading (normalize.py)
LOCALES = [
    ("1234.5", "1.234,5", T), ("1234.5", "1 234,5", T), ("1234", "1'234", T), ("1234567", "1.234.567", T),
    ("1234567", "1'234'567", T), ("1234567.25", "1.234.567,25", T), ("1000.99", "1000,99", T), ("2.74", "2,74", T),
    ("0.111", "0,111", T), ("1,22", "1.22", T), ("0.5", "0,5", T), (r"\frac{1}{2}", "0,5", T), ("1, 5", "1,5", T),
    ("1,5", "1, 5", T), ("1,5", "5, 1", T), ("-2,1", "-2.1", T),
    ("1234.5", "1.234,6", F), ("1234", "1'235", F), ("1234", "1.234", F), ("1.234", "1234", F), ("1.5", "1,6", F),
    ("1,5", "1.6", F), ("1,5", "1, 6", F), (r"\pi", "3,14", F), ("1234567", "1.234.568", F), ("0.111", "0,112", F),
    ("2", "1,5", F), ("1000", "1'000,5", F),
]

# GSM8K-style and reasoning-gym completions: "####", currency, units, "x = 5", mixed numbers,
# locale separators, <answer> tags
GSM8K = [
    ("1234", "She earns 1,000 + 234 = 1,234 dollars.\n#### 1,234", T),
    ("1234", "She earns 1,000 + 235 = 1,235 dollars.\n#### 1,235", F),
    ("1234.5", "The total cost is $1,234.50.", T), ("1234.5", "The total cost is $1,234.05.", F),
    ("1234.5", "The answer is: $1,234.50", T), ("1234.5", "Total cost is \u20ac1.234,50.", T),
    ("1234.5", "Total cost is \u20ac1.234,05.", F), ("1234", "So there are 1 234 apples left.", T),
    ("1234", "So there are 1 243 apples left.", F), ("1234", "#### 1'234", T), ("1234", "#### 1.234", F),
    ("72", "#### 7,2", F), ("12", "The answer is 12 USD.", T), ("12", "The answer is USD 12.", T),
    ("12", "The answer is 13 USD.", F), ("5", "Solving, x = 5", T), ("5", "Solving, x = 6", F),
    ("5", "<answer>x = 5</answer>", T), ("5", "<answer>x = 6</answer>", F), ("3.5", "She needs 3 1/2 cups of flour.", T),
    ("3.5", "She needs 3 1/3 cups of flour.", F), (r"\frac{7}{2}", "<answer>3 1/2</answer>", T),
    ("-3.5", "The answer is -3 1/2.", T), ("3.5", "The answer is 3 1/2 hours.", T), ("3.5", "The answer is 12 5/3.", F),
    ("1234", "<answer>1,234</answer>", T), ("1234", "<answer>1234", U), ("7", "<think>maybe 8</think><answer>7</answer>", T),
    ("7", "<think>maybe 7</think><answer>8</answer>", F), ("5", "The answer is 5 km.", T), ("5", "The answer is 5km.", T),
    ("1000.99", "not it's not 10 it's 1,000.99m\u00b2", T), ("1000.99", "not it's not 10 it's 1,000.98m\u00b2", F),
    ("5", "5cm", T), ("5", "6cm", F), ("5cm", "5", T), ("5", "5 m", T), ("5m", "5", F), ("12", "The answer is $12.00.", T), ("12", "It costs \\$12.", T),
]

# shapes added with Math-Verify's own test rows: ratios, |x| and f(x) in inequalities, sums,
# matrix arithmetic, repeated values, solution groups, names on the left of "=", twice-escaped text
SHAPES = [
    ("7:32", "7:32", T), ("7:32", "14:64", T), ("7:32", r"\frac{7}{32}", T), ("7:32", "32:7", F), ("12:00", "12:00", T),
    ("12:00", "1:00", F), ("A:B=1:2", "1:2", T), ("A:B=1:2", "2:1", F), ("1:2:3", "2:4:6", T), ("1:2:3", "1:3:2", F),
    ("A:B=1", "1", T), ("A:B=1", "2", F), (r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\frac{\sqrt6}{6}", T),
    (r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\frac{\sqrt6}{3}", F),
    (r"1 \le |z| \le 2", r"[-2,-1] \cup [1,2]", T), (r"1 \le |z| \le 2", r"[1,2]", F), (r"|x| < 3", "(-3, 3)", T),
    (r"|x| < 3", "[-3, 3]", F), (r"|x| > 1", r"(-\infty,-1) \cup (1,\infty)", T),
    (r"|x| \ge 1", r"(-\infty,-1) \cup (1,\infty)", F), ("0 < f(x) < 1", "(0,1)", T), ("0 < f(x) < 1", "[0,1)", F),
    (r"\sum_{k=1}^{10} k", "55", T), (r"\sum_{k=1}^{10} k", "56", F), (r"\sum_{k=1}^{n} k^2", r"\sum_{j=1}^{n} j^2", T),
    (r"\sum_{k=1}^{n} k^2", r"\sum_{k=1}^{n} k^3", F), (r"F_n = \sum_{k=0}^{n-1} F_k F_{n-k-1}", r"\sum_{k=0}^{n-1} F_{n-k-1} F_k", T),
    (r"F_n = \sum_{k=0}^{n-1} F_k F_{n-k-1}", r"\sum_{k=0}^{n-2} F_k F_{n-k-2}", F), (r"\prod_{k=1}^{4} k", "24", T),
    (r"\begin{pmatrix}6&8\\10&12\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}+\begin{pmatrix}5&6\\7&8\end{pmatrix}", T),
    (r"\begin{pmatrix}6&8\\10&12\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}+\begin{pmatrix}5&6\\7&9\end{pmatrix}", F),
    (r"\begin{pmatrix}19&22\\43&50\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}\begin{pmatrix}5&6\\7&8\end{pmatrix}", T),
    (r"\begin{pmatrix}19&22\\43&50\end{pmatrix}", r"\begin{pmatrix}5&6\\7&8\end{pmatrix}\begin{pmatrix}1&2\\3&4\end{pmatrix}", F),
    (r"\begin{pmatrix}2&4\\6&8\end{pmatrix}", r"2\begin{pmatrix}1&2\\3&4\end{pmatrix}", T),
    ("(1,2),(3,4)", "(1,2),(3,4),(1,2)", T), ("1,2", "1,2,2", T), ("1,1,2", "1,2", F), ("1,2", "1,2,3,3", F),
    ("p=5,q=2;p=7,q=2", "(5,2),(7,2)", T), ("p=5,q=2;p=7,q=2", "(5,2),(2,7)", F), ("W(n) = 1", "1", T),
    (r"2\ell", r"\ell \cdot 2", T), (r"2\ell", "2", F), ("a = b = 0", "0", T), (r"1 = \zzz = x = 0", "0", T),
    (r"\frac{1}{2}", r"\\frac{1}{2}", T), (r"\frac{1}{2}", r"\\frac{1}{3}", F),
    (r"(3,\frac{\pi}{2})", r"\\left( 3, \\frac{\\pi}{2} \\right)", T), (r"-2 \le x \le 7", r"-2 \\le x \\le 7", T),
    (r"\frac{1}{12}", "0.0833333333333333", T), (r"\frac{1}{12}", "0.0833333333333343", F),
    (r"\sqrt{17}", "4.123105625617661", T), (r"\sqrt{17}", "4.123105625617671", F), ("4.123105625617661", r"\sqrt{17}", T),
    (r"\frac{1}{3}", "0.33", F), (r"\frac{1}{3}", "0.333333333333", T), ("0.1", "0.1000000000001", F),
]

# pathological predictions: must come back wrong (or timeout) quickly
PATHOLOGICAL = [
    ("2", r"2^{2^{2^{2^{2^{2^{2}}}}}}", "fail"),
    ("2", r"9^{9^{9^{9}}}", "fail"),
    ("2", r"10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 2", T),  # huge but equal: cancels symbolically
    ("1", r"(x+1)^{100000} - (x+1)^{100000} + 1", T),
    ("3", r"10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 2", "fail"),
    ("0", r"100000!", "fail"),
    ("3", "+".join(["1"] * 400), "fail"),
    ("3", "{" * 500 + "3" + "}" * 500, "fail"),
    ("3", "(" * 500 + "3" + ")" * 500, "fail"),
    ("3", "{" * 300 + "3" + "}" * 300, "fail"),  # under the length cap: the depth cap refuses it
    ("3", "{" * 300 + "4" + "}" * 300, "fail"),
    ("3", r"\sqrt{" * 200 + "3" + "}" * 200, "fail"),
    ("3", "1" * 200_000, "fail"),
    ("3", r"\frac{\frac{\frac{", "fail"),
    ("3", r"\sqrt{", "fail"),
    ("3", r"\begin{pmatrix} 1 & 2", "fail"),
    ("3", r"\left( \right) ] [ ( ^ _ & \\", "fail"),
    ("3", r"\sin^{\sin^{\sin}}", "fail"),
    ("x", r"\sin(\cos(\tan(\sin(\cos(\tan(\sin(\cos(\tan(x)))))))))^{1000}", "fail"),
    # huge exponents and factorials
    ("2", r"10^{10^{100}}", "fail"), ("1", r"(10^{100})!", "fail"), ("3", r"\binom{10^{10}}{10^{5}}", "fail"),
    ("3", r"2^{10^{6}} - 2^{10^{6}} + 4", "fail"), ("3", r"\frac{d}{dx}x^{10^{10}}", "fail"),
    ("0", r"e^{e^{e^{e^{e^{10}}}}} - e^{e^{e^{e^{e^{10}}}}} + 1", "fail"),
    # nested radicals (the deep ones stop at the parser's depth cap)
    ("2", r"\sqrt{2+" * 40 + "2" + "}" * 40, "fail"),
    ("3", "".join(r"\sqrt[%d]{%d+" % (k + 2, k) for k in range(25)) + "1" + "}" * 25, "fail"),
    ("3", r"\sqrt[7]{" * 50 + "9^{9^{9}}" + "}" * 50, "fail"),
    # long sums
    ("5", r"\sum_{k=1}^{9999} k^{k}", "fail"), ("5", r"\sum_{k=1}^{10^{9}} k^{k}", "fail"),
    ("5", r"\prod_{k=1}^{5000} (k^{k}+1)", "fail"), ("3", "+".join(f"x^{{{k}}}" for k in range(1, 100)), "fail"),
    ("3", "+".join(["1"] * 190), "fail"), ("3", "+".join(f"{k}^{{{k}}}" for k in range(100, 190)), "fail"),
    # deep LaTeX
    ("3", r"\frac{1}{" * 55 + "3" + "}" * 55, "fail"), ("3", r"\left(" * 300 + "3" + r"\right)" * 300, "fail"),
    ("3", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}" * 25, "fail"),
    ("3", "+".join([r"\begin{pmatrix}9^{9^{9}}&2\\3&4\end{pmatrix}"] * 20), "fail"),
    ("3", "1,5" * 300, "fail"), ("3", "x=" * 400 + "4", "fail"),
]

CASES = [
    (cat, gold, pred, expected)
    for cat, rows in [
        ("numbers", NUMBERS), ("normalisation", NORMALISATION), ("symbolic", SYMBOLIC), ("complex", COMPLEX),
        ("structures", STRUCTURES), ("intervals", INTERVALS), ("equations", EQUATIONS), ("hedging", HEDGING),
        ("extract", EXTRACT), ("completions", COMPLETIONS), ("locales", LOCALES), ("gsm8k", GSM8K),
        ("shapes", SHAPES), ("pathological", PATHOLOGICAL),
    ]
    for gold, pred, expected in rows
]


def completion_for(category: str, pred: str) -> str:
    """The completion a row stands for (see module docstring)."""
    if category in ("extract", "completions", "gsm8k"):
        return pred
    return f"Let me work through it step by step. Putting it together, the answer is $\\boxed{{{pred}}}$."
